"""The empirical audit's report: its section of the audit report (:func:`markdown`) and its MLflow metrics and
tags (:func:`log_mlflow`, the keys :data:`MLFLOW_METRICS`)."""

from __future__ import annotations

from typing import Sequence

MLFLOW_METRICS = {
    "epsilon_lower_empirical": "one-run canary audits on public stand-ins (no sensitive record enters): the largest "
                               "of every audited part's bound",
    "epsilon_lower_white_box": "the training steps' white-box canaries' bound (same audit run)",
    "epsilon_lower_black_box": "the training steps' black-box canaries' bound (same audit run)",
    "epsilon_accounted_empirical": "ε of the audited training steps by the method's accountant (the plan)",
    "epsilon_lower_warmup": "the largest bound of the warm-up releases' canary audits (public stand-in)",
    "empirical_canaries": "audit.canaries (configuration)",
    "empirical_cpu_seconds": "CPU time of the audit runs (public stand-ins: data-independent)",
}


def markdown(result: dict | None) -> str:
    """The report's section: the verdict, ε_lower beside ε per audited part, and the training steps' attacks."""
    if not result:
        return ("\n## Empirical audit\n\nNot run (audit.empirical=off, or the method has no empirical audit): "
                "no measured lower bound.\n")
    parts = "".join(
        f"| {p['name']} | **{p['verdict']}** | {p['epsilon_lower']:.4g} | {p['accounted_epsilon']:.4g} | "
        f"{p['ceiling']:.3g} | {p['canaries']} | " + (
            f"{p['mode']}, {p['steps']} steps, σ = {p['noise_multiplier']:.4g}, q = {p['sample_rate']:.4g}"
            if p["name"] == "training" else
            f"σ = {p['noise_multiplier']:.4g}; noise std {p['noise_test']['noise_std_over_planned']:.4f} × planned over "
            f"{p['noise_test']['coordinates']} coordinates; largest canary coordinate "
            f"{p['bound_test']['largest_canary_coordinate']:.4g} ≤ {p['bound_test']['bound']:.4g}; one-run bound "
            f"{p['one_run']}") + " |\n" for p in result["components"])
    out = ("\n## Empirical audit (one-run canary audits)\n\n"
           f"Verdict: **{result['verdict'].upper()}**. ε_lower = **{result['epsilon_lower']:.4g}** "
           f"({result['confidence']:.0%} confidence: each of the {len(result['components'])} parts at "
           f"{result['components'][0]['confidence']:.2%}), the largest over the audited parts, each against the "
           f"accounted ε of that part ({result['cpu_seconds']:.1f} CPU-s).\n\n"
           "| part | verdict | ε_lower | accounted ε | largest provable ε | canaries m | what was measured |\n"
           "|---|---|---|---|---|---|---|\n" + parts +
           "\npassed: the test could have failed and did not; failed: the code does not implement the accounted "
           "mechanism; inconclusive: with m canaries no one-run audit can prove an ε as large as the accounted "
           "one, so nothing was shown. Every warm-up release (intensity histogram, class means, polarity shapes, style "
           "groups, variation directions: those the configuration makes) has its audit run, and is also tested "
           "against the plan's σ and bound directly (noise and bound tests, which can fail at any ε); the intensity "
           "histogram's one-run bound has one canary per bin (16) and so little power, and its noise test 16 "
           "coordinates (it catches noise that is missing, not noise that is somewhat smaller).\n")
    training = next((p for p in result["components"] if p["name"] == "training"), None)
    if training:
        rows = "".join(f"| {a['name']} | {a['epsilon_lower']:.4g} | {a['ceiling']:.3g} | {a['canaries']} | "
                       f"{a['guesses']} | {a['correct']} | {a['attack']} |\n" for a in training["attacks"])
        out += ("\n### The training steps\n\n"
                "| attack | ε_lower | largest provable ε | canaries m | guesses | correct | how |\n"
                "|---|---|---|---|---|---|---|\n" + rows +
                f"\nWhat makes them comparable: {training['comparison']}.\n\n"
                f"Privacy cost of the audit runs: {training['privacy_cost']}; the warm-up releases' canaries join a "
                "stand-in that holds no other record.\n")
    return out


def log_mlflow(result: dict | None, *, tracking_uri: str | None = None, also: Sequence[str | None] = ()) -> None:
    """The empirical figures on the active (audit) MLflow run; its tags also on the runs ``also`` names."""
    if not result:
        return
    from dpsynth import tracking

    parts = {p["name"]: p for p in result["components"]}
    metrics = {"epsilon_lower_empirical": result["epsilon_lower"], "empirical_canaries": result["canaries"],
               "empirical_cpu_seconds": result["cpu_seconds"]}
    if "training" in parts:
        white, *black = parts["training"]["attacks"]  # Private Evolution's histograms: one white-box attack
        metrics.update({"epsilon_lower_white_box": white["epsilon_lower"],
                        "epsilon_accounted_empirical": parts["training"]["accounted_epsilon"]})
        if black:
            metrics["epsilon_lower_black_box"] = black[0]["epsilon_lower"]
    warm = [p["epsilon_lower"] for name, p in parts.items() if name.startswith("warmup.")]
    if warm:
        metrics["epsilon_lower_warmup"] = max(warm)
    tracking.log_run(tracking.LoggedKeys(metrics=MLFLOW_METRICS), metrics=metrics, tags=tracking.empirical_tags(result))
    for run_id in dict.fromkeys(r for r in also if r):
        tracking.log_run(None, tags=tracking.empirical_tags(result), run_id=run_id, tracking_uri=tracking_uri)
