"""Private Evolution on the public prior (#51): CNN accuracy of a classifier trained on its release, tested on real.

On one set of ``benchmarks/datasets.py`` (drawn and imported as ``utility.py --dataset NAME`` does, the same
records), partitioned as the pipeline does with the generic recipe's settings (``data.heldout_fraction=0.2``, the
shipped partition key), so the test records are those of the recorded generality rows: the training shard(s) are
the private records; Private Evolution (``dpsynth.mechanisms.private_evolution``) runs on them at ``--epsilon``
(σ per round calibrated by the RDP accountant on the mechanism's own events; the trace's ε recomputed by RDP and
PRV); its release (``sample.num_samples`` records) is scored by the evaluate stage's CNN and logistic regression
(``accuracy.utility``: trained on synthetic, the epoch chosen on synthetic validation, tested on the held-out test
half). ``--ceiling`` adds the same classifiers trained on the real training records.

    nice .venv/stage/bin/python benchmarks/private_evolution.py --dataset letters-rgb --ceiling \
        --results benchmarks/results/utility-private-evolution-letters-rgb-cpu.json

Results are appended (one row per run) to ``--results``; the sample grid goes to ``--grid``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from dpsynth.config import load_config  # noqa: E402
from dpsynth.data import ImageDataset, read_parquet  # noqa: E402
from dpsynth.evaluation import accuracy  # noqa: E402
from dpsynth.mechanisms import private_evolution as pe  # noqa: E402
from dpsynth.mechanisms.randomness import MechanismRandomness  # noqa: E402
from dpsynth.privacy import MechanismTrace, get_accountant  # noqa: E402
from dpsynth.stages.evaluate import _split  # noqa: E402
from dpsynth.stages.partition import split  # noqa: E402

RECIPE = "configs/dpgan-generic-cpu.yaml"  # its data, partition, sample and evaluate settings


def records(name: str, out: Path, n: int, seed: int):
    """(cfg, private training records, fit_real, test_real, the set's description)."""
    import utility

    parquet, info = utility.import_dataset(name, out / name, n=n, seed=seed)
    ds = read_parquet(str(parquet))
    cfg = load_config(ROOT / RECIPE, overrides=[f"data.uri={parquet}", *utility.GENERATED_EXTRA,
                                                f"data.num_classes={ds.num_classes}"])
    parts = split(ds, cfg)
    shards = [v for k, v in sorted(parts.items()) if k.startswith("shard-")]
    train = shards[0] if len(shards) == 1 else ImageDataset.concat(shards)
    fit_idx, test_idx = _split(len(parts["heldout"]), fraction=0.5, seed=cfg.evaluate.seed)
    return cfg, train, parts["heldout"].subset(fit_idx), parts["heldout"].subset(test_idx), info


def score(cfg, synthetic: ImageDataset, fit_real, test_real, *, frechet: bool = False) -> dict:
    """The evaluate stage's CNN and logistic regression (and, with ``frechet``, its fid_classifier and real-vs-real
    floor: ``stages.evaluate.quality`` with its reference classifier) on ``synthetic``."""
    val, tr = _split(len(synthetic), fraction=cfg.evaluate.validation_fraction, seed=cfg.evaluate.seed)
    u = accuracy.utility(cfg, synthetic=synthetic.subset(tr), validation=synthetic.subset(val), fit_real=fit_real,
                         test_real=test_real, names=("cnn", "logreg"))
    rows = {r["classifier"]: r for r in u["classifiers"]}
    out = {"cnn_gen2real": rows["cnn"]["gen2real"], "logreg_gen2real": rows["logreg"]["gen2real"],
           "cnn_model_selection": rows["cnn"].get("model_selection")}
    if frechet:
        from dpsynth.evaluation import fid
        from dpsynth.evaluation.classifiers import ReferenceClassifier
        from dpsynth.stages.evaluate import quality

        e = cfg.evaluate
        classifier = ReferenceClassifier(fit_real, steps=e.feature_steps, seed=e.seed)
        q = quality(cfg, synthetic=synthetic, fit_real=fit_real, test_real=test_real, classifier=classifier,
                    space=fid.feature_space(e.inception_weights, classifier))
        out.update({q["frechet"]["name"]: q["frechet"]["value"], "frechet_real_vs_real": q["frechet"]["real_vs_real"],
                    "inception_score": q["inception_score"]["mean"]})
    return out


def grid(images: np.ndarray, labels: np.ndarray, k: int, path: Path, per_class: int = 10) -> None:
    from PIL import Image

    rows = [images[np.flatnonzero(labels == c)[:per_class]] for c in range(k)]
    h, w, c = images.shape[1:]
    g = np.concatenate([np.concatenate(list(r), axis=1) for r in rows], axis=0)
    Image.fromarray(g if c == 3 else g[..., 0]).save(path, optimize=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="letters-rgb")
    ap.add_argument("--n", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=0, help="the set's seed")
    ap.add_argument("--epsilon", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--candidates", type=int, default=200, help="candidate figures per class")
    ap.add_argument("--threshold", type=float, default=2.0, help="H in units of the per-round σ")
    ap.add_argument("--steps", default="0.3,0.05", help="the variation step of the first and the last round")
    ap.add_argument("--jitter", type=float, default=0.05, help="the release's variation step")
    ap.add_argument("--prior-seed", type=int, default=0, help="the public seed of the prior and the variations")
    ap.add_argument("--noiseless", action="store_true", help="σ = 0 (not private): the mechanism's upper bound")
    ap.add_argument("--ceiling", action="store_true")
    ap.add_argument("--frechet", action="store_true", help="also the evaluate stage's fid_classifier and its floor")
    ap.add_argument("--out", default=str(ROOT / "outputs/bench-private-evolution"))
    ap.add_argument("--results", required=True)
    ap.add_argument("--grid", default=None)
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg, train, fit_real, test_real, info = records(a.dataset, out, a.n, a.seed)
    results = Path(a.results)
    rows = json.loads(results.read_text())["rows"] if results.exists() else []

    def save(row):
        print(json.dumps(row), flush=True)
        rows.append(row)
        results.write_text(json.dumps({**info, "recipe_settings": RECIPE, "rows": rows}, indent=2) + "\n")

    if a.ceiling:
        cpu0 = time.process_time()
        save({"row": "ceiling", "what": f"real training records ({len(train)})",
              **score(cfg, train, fit_real, test_real), "cpu_min": (time.process_time() - cpu0) / 60})
    delta = cfg.privacy.delta
    sigma = 0.0 if a.noiseless else pe.calibrate(epsilon=a.epsilon, delta=delta, rounds=a.rounds)
    threshold = a.threshold * sigma if sigma > 0 else 0.5
    steps = tuple(float(s) for s in a.steps.split(","))
    x, y = train.images, train.labels
    cpu0, t0 = time.process_time(), time.monotonic()
    trace = MechanismTrace()
    evo = pe.evolve(x, y, num_classes=train.num_classes, rounds=a.rounds, candidates=a.candidates,
                    noise_multiplier=sigma, threshold=threshold, randomness=MechanismRandomness(), trace=trace,
                    seed=a.prior_seed, steps=steps)
    images, labels = pe.sample(evo, cfg.sample.num_samples, size=x.shape[1], channels=x.shape[3],
                               seed=a.prior_seed + 1, jitter=a.jitter)
    cpu_release = (time.process_time() - cpu0) / 60
    synthetic = ImageDataset(record_ids=[f"s{i}" for i in range(len(labels))], labels=labels, images=images,
                             splits=None, num_classes=train.num_classes, source="private evolution")
    scores = score(cfg, synthetic, fit_real, test_real, frechet=a.frechet)
    eps = {name: (get_accountant(name).epsilon(trace, delta=delta) if sigma > 0 else float("inf"))
           for name in ("rdp", "prv")}
    if a.grid:
        grid(images, labels, train.num_classes, Path(a.grid))
    alive = [int((w > 0).sum()) for w in evo.weights]
    save({"row": "private-evolution", "epsilon_target": a.epsilon if sigma > 0 else None, "delta": delta,
          "epsilon_rdp": eps["rdp"], "epsilon_prv": eps["prv"], "noise_multiplier": sigma, "rounds": a.rounds,
          "candidates_per_class": a.candidates, "threshold_votes": threshold, "steps": list(steps),
          "jitter": a.jitter, "prior_seed": a.prior_seed, "private_records": len(train),
          "test_records": len(test_real), "synthetic_records": len(labels), **scores,
          "figures_kept_per_class": alive, "cpu_min_release": cpu_release,
          "cpu_min_total": time.process_time() / 60, "wall_min": (time.monotonic() - t0) / 60,
          "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
          "grid": a.grid, "note": a.note,
          "command": "benchmarks/private_evolution.py " + " ".join(sys.argv[1:])})


if __name__ == "__main__":
    main()
