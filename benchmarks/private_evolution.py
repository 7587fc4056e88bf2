"""Private Evolution on the public prior (#51): CNN accuracy of a classifier trained on its release, tested on real.

On one set of ``benchmarks/datasets.py`` (drawn and imported as ``utility.py --dataset NAME`` does, the same
records), partitioned as the pipeline does with the generic recipe's settings (``data.heldout_fraction=0.2``, the
shipped partition key), so the test records are those of the recorded generality rows: the training shard(s) are
the private records; Private Evolution (``dpsynth.mechanisms.private_evolution``) runs on them at ``--epsilon``
(σ per round calibrated by the RDP accountant on the mechanism's own events; the trace's ε recomputed by RDP and
PRV); its release (``sample.num_samples`` records) is scored by the evaluate stage's CNN and logistic regression
(``accuracy.utility``: trained on synthetic, the epoch chosen on synthetic validation, tested on the held-out test
half). ``--ceiling`` adds the same classifiers trained on the real training records.

    nice .venv/stage/bin/python benchmarks/run.py private-evolution 'symbols-rgb-*'

(the suite ``private-evolution`` of ``benchmarks/suites.toml``; results in
``benchmarks/results/private-evolution.json``, the sample grids where a row's ``grid_path`` says).
"""

from __future__ import annotations

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


def records(name: str, out: Path, n: int, seed: int, overrides=()):
    """(cfg, private training records, fit_real, test_real, the set's description); ``overrides``: --set items."""
    import utility

    parquet, info = utility.import_dataset(name, out / name, n=n, seed=seed)
    ds = read_parquet(str(parquet))
    cfg = load_config(ROOT / RECIPE, overrides=[f"data.uri={parquet}", *utility.GENERATED_EXTRA,
                                                f"data.num_classes={ds.num_classes}", *overrides])
    parts = split(ds, cfg)
    shards = [v for k, v in sorted(parts.items()) if k.startswith("shard-")]
    train = shards[0] if len(shards) == 1 else ImageDataset.concat(shards)
    fit_idx, test_idx = _split(len(parts["heldout"]), fraction=0.5, seed=cfg.evaluate.seed)
    return cfg, train, parts["heldout"].subset(fit_idx), parts["heldout"].subset(test_idx), info


def score(cfg, synthetic: ImageDataset, fit_real, test_real, *, frechet: bool = False,
          classifiers: tuple[str, ...] = ("cnn",)) -> dict:
    """The evaluate stage's ``classifiers`` (cnn, resnet) and logistic regression (and, with ``frechet``, its fid_classifier and real-vs-real
    floor: ``stages.evaluate.quality`` with its reference classifier) on ``synthetic``."""
    val, tr = _split(len(synthetic), fraction=cfg.evaluate.validation_fraction, seed=cfg.evaluate.seed)
    u = accuracy.utility(cfg, synthetic=synthetic.subset(tr), validation=synthetic.subset(val), fit_real=fit_real,
                         test_real=test_real, names=(*classifiers, "logreg"))
    out = {}
    for r in u["classifiers"]:
        out[f"{r['classifier']}_gen2real"] = r["gen2real"]
        if r["classifier"] != "logreg":
            out[f"{r['classifier']}_model_selection"] = r.get("model_selection")
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


def measure(*, dataset: str = "letters-rgb", n: int = 6000, seed: int = 0, epsilon: float = 10.0, rounds: int = 10,
            candidates: int = 200, threshold: float = 2.0, steps: tuple[float, float] = (0.3, 0.05),
            jitter: float = 0.05, prior_seed: int = 0, noiseless: bool = False, ceiling: bool = False,
            frechet: bool = False, grid_path: str | None = None, classifiers: tuple[str, ...] = ("cnn",),
            release: bool = True, overrides: tuple[str, ...] = (), feature: str = "plane",
            out: str = str(ROOT / "outputs/bench-private-evolution")) -> dict:
    """Private Evolution on ``dataset`` (``n`` records drawn with ``seed``) at ``epsilon``: ``rounds`` rounds of
    ``candidates`` figures a class, the threshold H = ``threshold`` × σ, the variation step from ``steps[0]`` to
    ``steps[1]``, the release varied by ``jitter``, the prior's public seed ``prior_seed`` (``noiseless``: σ = 0, not
    private, the mechanism's upper bound); ``ceiling`` adds the classifiers trained on the real training records,
    ``frechet`` the evaluate stage's fid_classifier; the sample grid to ``grid_path``; ``classifiers`` score every
    row (cnn, resnet: ``accuracy.utility``'s), ``release`` false runs the ceiling only, ``overrides`` are --set items
    of the recipe (e.g. ``evaluate.resnet_epochs=15``), ``feature`` the records' feature (``pe.FEATURES``: ``plane``,
    ``segmenter``, ``hybrid``). About 3 CPU-minutes and
    1.5 GB a row. Returns the set's description and its rows."""
    torch.set_num_threads(1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg, train, fit_real, test_real, info = records(dataset, out, n, seed, overrides)
    classifiers = tuple(classifiers)
    rows = []
    if ceiling:
        cpu0 = time.process_time()
        rows.append({"row": "ceiling", "what": f"real training records ({len(train)})",
                     **score(cfg, train, fit_real, test_real, classifiers=classifiers),
                     "cpu_min": (time.process_time() - cpu0) / 60})
    if not release:
        return {**info, "recipe_settings": RECIPE, "rows": rows}
    delta = cfg.privacy.delta
    sigma = 0.0 if noiseless else pe.calibrate(epsilon=epsilon, delta=delta, rounds=rounds)
    votes = threshold * sigma if sigma > 0 else 0.5
    steps = tuple(float(s) for s in steps)
    x, y = train.images, train.labels
    cpu0, t0 = time.process_time(), time.monotonic()
    trace = MechanismTrace()
    evo = pe.evolve(x, y, num_classes=train.num_classes, rounds=rounds, candidates=candidates,
                    noise_multiplier=sigma, threshold=votes, randomness=MechanismRandomness(), trace=trace,
                    seed=prior_seed, steps=steps, feature=feature)
    images, labels = pe.sample(evo, cfg.sample.num_samples, size=x.shape[1], channels=x.shape[3],
                               seed=prior_seed + 1, jitter=jitter)
    cpu_release = (time.process_time() - cpu0) / 60
    synthetic = ImageDataset(record_ids=[f"s{i}" for i in range(len(labels))], labels=labels, images=images,
                             splits=None, num_classes=train.num_classes, source="private evolution")
    scores = score(cfg, synthetic, fit_real, test_real, frechet=frechet, classifiers=classifiers)
    eps = {name: (get_accountant(name).epsilon(trace, delta=delta) if sigma > 0 else float("inf"))
           for name in ("rdp", "prv")}
    if grid_path:
        grid(images, labels, train.num_classes, Path(grid_path))
    alive = [int((w > 0).sum()) for w in evo.weights]
    rows.append({"row": "private-evolution", "epsilon_target": epsilon if sigma > 0 else None, "delta": delta,
                 "epsilon_rdp": eps["rdp"], "epsilon_prv": eps["prv"], "noise_multiplier": sigma, "rounds": rounds,
                 "candidates_per_class": candidates, "threshold_votes": votes, "steps": list(steps),
                 "jitter": jitter, "prior_seed": prior_seed, "feature": feature, "private_records": len(train),
                 "test_records": len(test_real), "synthetic_records": len(labels), **scores,
                 "figures_kept_per_class": alive, "cpu_min_release": cpu_release,
                 "cpu_min_total": time.process_time() / 60, "wall_min": (time.monotonic() - t0) / 60,
                 "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "grid": grid_path})
    return {**info, "recipe_settings": RECIPE, "rows": rows}
