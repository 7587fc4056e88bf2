"""Empirical privacy audit: a measured *lower* bound on ε, beside the accountant's upper bound.

It holds the audit runs: one of a method's own trainer and sanitizer with canaries on a public stand-in and its
two attacks (:func:`run_audit`; Private Evolution's histograms: :func:`audit_votes`), their check (:func:`gate`),
:func:`comparison`, and every audit run of a configuration (:func:`audit_all`: the training steps and each warm-up
release). The one-run bound is :mod:`dpsynth.audit.statistics`', the canaries and stand-ins
:mod:`dpsynth.audit.canaries`', the warm-up releases' audit :mod:`dpsynth.audit.warmup`'s and the report's section
and MLflow figures :mod:`dpsynth.audit.report`'s. What each attack
scores, why the bound holds at the stated confidence, and what the audit run costs: docs/privacy.md,
"The empirical audit's run, attacks and bound".
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from dpsynth.audit.canaries import (ATTACKS, BLACK_BOX, BLACK_BOX_SHARE, InputCanaries, add_records,
                                    attach_white_box, black_box_scores, public_seed, stand_in_trainer, vote_canaries)
from dpsynth.audit.statistics import guess_and_bound, reachable_ceiling, verdict
from dpsynth.audit.warmup import audit_warmup_release, audited_releases, warmup_check
from dpsynth.errors import ConfigError, PrivacyError
from dpsynth.methods import registry


def audit_steps(cfg, total_steps: int) -> int:
    a = cfg.audit
    return total_steps if a.empirical == "full" else min(total_steps, a.quick_steps)


def comparison(method: registry.Method, accountant: str) -> str:
    """Why the canaries' ε_lower and the accounted ε of the audited steps measure the same thing."""
    if method.empirical_audit == "input_gradient":
        return (f"accounted by the `{accountant}` accountant, as the trained run: a canary is one record of one "
                "shard, so adding it changes only the iterations that draw its shard (rate 1/K, without "
                "replacement), each of whose B sanitized releases moves by ≤ 2C — the trace's replace_one event at "
                "the shard level, folded to σ/√B, exactly as for a record. The scores read the releases and the "
                "public canary design only, never the secret shard choice: an adversary who sees the choice is "
                "bound only by the revealed-choice account, not by this ε. The white-box canaries enter the "
                "gradients directly, not through D_k's training, so they do not test GS-WGAN's shard-state "
                "assumption; the black-box canaries, records of their shards, go through D_k and rest on it")
    return (f"accounted by the `{accountant}` accountant, as the trained run: a canary is one record, added or "
            "removed, joining each step by its own Poisson coin at rate q, its clipped gradient of norm ≤ C "
            "(dp-GAN: c_j per group) — the trace's add_remove event. The white-box score subtracts the stand-in "
            "records' clipped sum, which does not depend on the canaries' coins")


def _attack(kind: str, scores, included, *, delta: float, confidence: float) -> dict:
    bound = guess_and_bound(scores, included, delta=delta, confidence=confidence)
    return {"name": kind, "attack": ATTACKS[kind], **bound}


def run_audit(cfg, *, n: int, image_shape: Sequence[int], num_classes: int, mode: str | None = None,
              canaries: int | None = None, mechanism_seed: int | None = None) -> dict:
    """One audit run of ``cfg``'s method on a public stand-in with n records: ε_lower of both attacks and
    the accounted ε of the steps audited. ``mode``/``canaries`` override ``audit.empirical``/``audit.canaries``;
    ``mechanism_seed``: tests only."""
    import tempfile

    from dpsynth.privacy import MechanismTrace

    mode = mode or cfg.audit.empirical
    m = canaries or cfg.audit.canaries
    if mode not in ("quick", "full"):
        raise ConfigError(f"audit.empirical: an audit run needs 'quick' or 'full', got {mode!r}")
    method = registry.get(cfg.train.method)
    kind = method.empirical_audit
    if not kind:
        raise ConfigError(f"audit.empirical: the empirical audit supports train.method in "
                          f"{list(registry.empirical_audit_methods())}, not {cfg.train.method!r} (yet); "
                          "set audit.empirical=off")
    cfg = dataclasses.replace(cfg, audit=dataclasses.replace(cfg.audit, empirical=mode, canaries=m))
    if kind == "votes":
        return audit_votes(cfg, n=n, mechanism_seed=mechanism_seed)
    started = time.process_time()
    with tempfile.TemporaryDirectory(prefix="dpsynth-empirical-") as tmp:
        trainer = stand_in_trainer(cfg, n=n, image_shape=image_shape, num_classes=num_classes, directory=tmp,
                                   mechanism_seed=mechanism_seed)
        white = attach_white_box(kind, trainer, m)
        black = InputCanaries(max(2, min(m, n // BLACK_BOX_SHARE)), image_shape, num_classes,
                              randomness=trainer.state.mechanism)
        add_records(method, trainer, black)
        steps = audit_steps(cfg, trainer.total_steps)
        for _ in range(steps):  # the trainer's own step (train() adds checkpoints and logging)
            trainer.train_step()
        black_scores = black_box_scores(BLACK_BOX[kind], trainer, black, seed=cfg.train.seed)
    audited = trainer.trace  # the sanitizer recorded each audited step's release itself
    if audited != MechanismTrace([trainer.event.with_count(steps)]):
        raise PrivacyError(f"audit run: {steps} steps audited, but the sanitizer recorded {audited!r}")
    p = cfg.privacy
    accountant = trainer.accountant.name
    accounted = trainer.accountant.epsilon(audited, delta=p.delta)
    each = 1 - (1 - cfg.audit.confidence) / 2  # two attacks: Bonferroni, so the larger bound holds at `confidence`
    attacks = [_attack(kind, white.scores.numpy(), white.included.numpy(), delta=p.delta, confidence=each),
               _attack(BLACK_BOX[kind], black_scores, black.included.numpy(), delta=p.delta, confidence=each)]
    reach = 1 - (1 - trainer.event.sample_rate) ** steps  # an included canary (or record) is ever sampled
    for a in attacks:  # what a perfect attack could prove at this sampling: the gate cannot fail above it
        a["ceiling"] = min(a["ceiling"], reachable_ceiling(a["canaries"], reach, delta=p.delta, confidence=each))
        a["reach"] = reach
    return {"epsilon_lower": max(a["epsilon_lower"] for a in attacks), "accounted_epsilon": accounted,
            "accountant": accountant, "canaries": m, "confidence": cfg.audit.confidence,
            "ceiling": max(a["ceiling"] for a in attacks), "attacks": attacks, "mode": mode,
            "method": cfg.train.method, "steps": steps, "noise_multiplier": trainer.event.noise_multiplier,
            "sample_rate": trainer.event.sample_rate, "comparison": comparison(method, accountant),
            "privacy_cost": "none: trained on a public stand-in of the same shape (uniform-noise images), "
                            "never on the sensitive records",
            "cpu_seconds": time.process_time() - started}


def audit_votes(cfg, *, n: int, mechanism_seed: int | None = None, noise_multiplier: float | None = None) -> dict:
    """One audit run of Private Evolution's histograms: the plan's σ and rounds (``noise_multiplier``: another σ,
    tests only), ``audit.canaries`` canary records each included by a secret ½ coin, voting by the mechanism's own
    :func:`~dpsynth.mechanisms.private_evolution.votes` beside the stand-in records, released by its own
    :func:`~dpsynth.mechanisms.private_evolution.noisy_votes` every round (each recorded in a trace); a canary's
    score is its bin's noisy votes summed over the rounds."""
    from dpsynth.mechanisms import private_evolution as pe
    from dpsynth.mechanisms.randomness import MechanismRandomness
    from dpsynth.privacy import MechanismTrace, get_accountant

    started = time.process_time()
    p, m = cfg.privacy, cfg.audit.canaries
    plan = pe.PRIVATE_EVOLUTION.plan(cfg, n)
    sigma = plan.noise_multiplier if noise_multiplier is None else noise_multiplier
    rounds = audit_steps(cfg, plan.steps)
    randomness = MechanismRandomness(secure_mode=p.secure_mode, seed=mechanism_seed)
    included = randomness.poisson_mask(m, 0.5).cpu().numpy()
    canaries, stand_in, candidates = vote_canaries(m, n=n, seed=public_seed())
    records = np.concatenate([canaries[included], stand_in])
    labels = np.zeros(len(records), np.int64)
    trace, scores = MechanismTrace(), np.zeros(m)
    for _ in range(rounds):
        query = pe.votes(records, labels, candidates, np.zeros(len(candidates), np.int64))
        scores += pe.noisy_votes(query, noise_multiplier=sigma, randomness=randomness)[:m]
        trace.record(pe.full_batch_gaussian(plan.noise_multiplier))  # what the plan accounts for each round
    accountant = get_accountant(p.accountant)
    attack = _attack("votes", scores, included, delta=p.delta, confidence=cfg.audit.confidence)
    attack["reach"] = 1.0
    return {"epsilon_lower": attack["epsilon_lower"], "accounted_epsilon": accountant.epsilon(trace, delta=p.delta),
            "accountant": accountant.name, "canaries": m, "confidence": cfg.audit.confidence,
            "ceiling": attack["ceiling"], "attacks": [attack], "mode": cfg.audit.empirical,
            "method": cfg.train.method, "steps": rounds, "noise_multiplier": plan.noise_multiplier, "sample_rate": 1.0,
            "comparison": f"accounted by the `{accountant.name}` accountant, as the trained run: a canary is one "
                          "record, added or removed, its one vote in one bin of every round's histogram — the "
                          "trace's full-batch add_remove event of sensitivity 1",
            "privacy_cost": "none: canaries and stand-in records of a public design (unit vectors of the feature "
                            "space), never the sensitive records",
            "cpu_seconds": time.process_time() - started}


def gate(result: dict) -> dict:
    """The check of one audit run of the training steps: fails when an attack's ε_lower > the accounted ε of
    the audited steps; ``verdict`` inconclusive (``passed`` None: neither) when it could not have failed."""
    lower, eps = result["epsilon_lower"], result["accounted_epsilon"]
    v = verdict(lower, eps, result["ceiling"])
    found = "; ".join(f"{a['name']}: ε_lower={a['epsilon_lower']:.4g} (m={a['canaries']}, {a['correct']}/"
                      f"{a['guesses']} guesses correct)" for a in result["attacks"])
    return {"name": "empirical", "passed": {"passed": True, "failed": False}.get(v), "verdict": v,
            "detail": (f"ε_lower={lower:.4g} ({100 * result['confidence']:.4g}% confidence over both attacks, "
                       f"{result['mode']}, {result['steps']} steps; {found}) {'≤' if v != 'failed' else '>'} accounted "
                       f"ε={eps:.4g} of the audited steps"
                       + ("" if v != "failed" else ": the code does not implement the accounted mechanism")
                       + ("" if v != "inconclusive" else
                          f"; INCONCLUSIVE: with m={result['canaries']} no audit can prove more than "
                          f"ε={result['ceiling']:.3g}{_reached(result)}, below the accounted ε (more canaries, or "
                          "audit a lower ε)"))}


def _reached(result: dict) -> str:
    reach = min((a.get("reach", 1.0) for a in result["attacks"]), default=1.0)
    return "" if reach >= 1 else f" when {reach:.0%} of the included canaries are ever sampled in {result['steps']} steps"


def mode_for(cfg) -> str | None:
    """The audit run's mode: ``auto`` (the default) is quick for the methods that have an empirical audit and
    none for the others; None: no audit run."""
    mode = cfg.audit.empirical
    if mode == "auto":
        return "quick" if registry.get(cfg.train.method).empirical_audit else None
    return None if mode == "off" else mode


def stage_audit(cfg, partition: dict) -> dict | None:
    """The audit stage's empirical step (None when it does not run): one audit run of the training steps and
    one per warm-up release, each with its check; ``verdict`` failed if any failed, else inconclusive if any
    is, else passed."""
    mode = mode_for(cfg)
    if mode is None:
        return None
    n, shape, classes = stand_in_shape(partition)
    return audit_all(cfg, n=n, image_shape=shape, num_classes=classes, mode=mode)


def audit_all(cfg, *, n: int, image_shape: Sequence[int], num_classes: int, mode: str) -> dict:
    """Every audit run of ``cfg``'s mechanism: the training steps (``mode``) and each warm-up release; the
    overall verdict and the checks (what :func:`stage_audit` returns; ``dpsynth audit empirical`` prints it)."""
    started = time.process_time()
    shape, classes = image_shape, num_classes
    releases = [name for name, _, _ in audited_releases(cfg)]
    # β = 1 − confidence split over the parts (Bonferroni): the largest of their bounds holds at `confidence`
    each = 1 - (1 - cfg.audit.confidence) / (1 + len(releases))
    training = run_audit(dataclasses.replace(cfg, audit=dataclasses.replace(cfg.audit, confidence=each)), n=n,
                         image_shape=shape, num_classes=classes, mode=mode)
    training = {**training, "name": "training", "check": gate(training)}
    training["verdict"] = training["check"]["verdict"]
    parts = [training]
    for name in releases:
        part = audit_warmup_release(cfg, name, image_shape=shape, num_classes=classes, canaries=cfg.audit.canaries,
                                    confidence=each)
        parts.append({**part, "check": warmup_check(part)})
    verdicts = {p["verdict"] for p in parts}
    overall = "failed" if "failed" in verdicts else "inconclusive" if "inconclusive" in verdicts else "passed"
    return {"verdict": overall, "epsilon_lower": max(p["epsilon_lower"] for p in parts),
            "canaries": cfg.audit.canaries, "confidence": cfg.audit.confidence, "mode": mode,
            "components": parts, "cpu_seconds": time.process_time() - started,
            "checks": [p["check"] for p in parts]}


def stand_in_shape(partition: dict) -> tuple[int, list[int], int]:
    """(n training records, image shape H×W×C, classes) from a partition manifest: public counts and shapes."""
    n = sum(o["rows"] for o in partition["outputs"] if o.get("role") == "shard")
    details = partition.get("details") or {}
    shape, classes = details.get("image_shape"), details.get("num_classes")
    if not n or not shape or not classes:
        raise ConfigError("audit.empirical: the partition manifest records no training records, image_shape "
                          "or num_classes; run dpsynth partition first")
    return n, shape, classes
