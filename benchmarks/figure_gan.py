"""Shape privately, look publicly (#51): the grey recipe on colour-blind figure maps, painted by the public prior.

On one RGB set of ``benchmarks/datasets.py`` (the records, partition and test records of
``private_evolution.py``'s rows):

1. every record becomes a grey 32 × 32 figure map by :func:`figure_maps`, a fixed public function of that record
   alone (:func:`dpsynth.mechanisms.private_evolution.background_distance` at full resolution,
   its median subtracted and its 99th percentile scaled to 255): a bright figure on a dark ground, whatever its
   colour or polarity. Applied record by record, it keeps add/remove neighbours neighbours, so the ε of step 2 holds
   for the RGB records;
2. the grey Parquet set (the same record ids, so the same partition) goes through the CLI's stages partition,
   pretrain, train, audit and sample of ``make run``'s configuration (``train.method: auto`` → dpgan on one
   channel: the private warm-up and the DP-GAN phase), ε = ``epsilon``;
3. each released grey sample, scaled to [0, 1], is the figure mask of the prior's painter
   (:func:`dpsynth.prior.paint.paint`, version 2's mix), public seed ``paint_seed``: post-processing;
4. the painted release is scored as Private Evolution's (``private_evolution.score``: the evaluate stage's CNN
   trained on it, tested on the held-out RGB test half).

    OMP_NUM_THREADS=1 nice .venv/stage/bin/python benchmarks/run.py private-evolution 'letters-texture-shapegan*'

(rows ``*-shapegan*`` of the suite ``private-evolution``; docs/prior.md, "Shape privately, look publicly").
"""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from dpsynth.data import ImageDataset, read_parquet, write_parquet  # noqa: E402
from dpsynth.mechanisms.private_evolution import background_distance  # noqa: E402
from dpsynth.prior.paint import paint  # noqa: E402

RECIPE = "configs/dpgan-mnist-cpu.yaml"  # make run's configuration: on one channel, the shipped grey recipe
STAGES = ("partition", "pretrain", "train", "audit", "sample")  # the evaluate stage would score grey: the benchmark scores RGB


def figure_maps(images: np.ndarray, *, low: float = 50.0, high: float = 99.0) -> np.ndarray:
    """uint8 N × H × W × C → uint8 N × H × W × 1: each record's distance map from its background plane (fitted per
    channel on the border ring), its ``low`` percentile mapped to 0 and its ``high`` percentile to 255, clipped.
    A function of each record alone and of nothing else.

    >>> x = np.zeros((2, 8, 8, 3), np.uint8); x[:, 3:5, 2:6] = (200, 30, 0); x[1] = 255 - x[1]
    >>> m = figure_maps(x); m.shape, int(m[0, 3, 3, 0]), int(m[0, 0, 0, 0]), bool((m[0] == m[1]).all())
    ((2, 8, 8, 1), 255, 0, True)
    """
    n, h, w, _ = images.shape
    d = background_distance(images).reshape(n, h * w)
    lo, hi = np.percentile(d, low, axis=1, keepdims=True), np.percentile(d, high, axis=1, keepdims=True)
    m = np.clip((d - lo) / np.maximum(hi - lo, 1e-6), 0, 1)
    return np.round(m * 255).astype(np.uint8).reshape(n, h, w, 1)


def stretch_masks(masks: np.ndarray, *, low: float = 50.0, high: float = 99.0) -> np.ndarray:
    """Each mask (N × H × W in [0, 1]) with its ``low`` percentile mapped to 0 and its ``high`` percentile to 1,
    clipped: a released sample's faint figure made a full figure mask (a function of that sample alone).

    >>> stretch_masks(np.array([[[0.1, 0.1], [0.1, 0.4]]]), high=100.0).tolist()
    [[[0.0, 0.0], [0.0, 1.0]]]
    """
    lo = np.percentile(masks, low, axis=(1, 2), keepdims=True)
    hi = np.percentile(masks, high, axis=(1, 2), keepdims=True)
    return np.clip((masks - lo) / np.maximum(hi - lo, 1e-6), 0, 1)


def _children() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, r.ru_maxrss / 2**20


def measure(*, dataset: str = "letters-texture", n: int = 6000, seed: int = 0, epsilon: float = 10.0,
            paint_seed: int = 0, overrides: tuple[str, ...] = (), frechet: bool = False, grid_path: str | None = None,
            grey_grid_path: str | None = None, stretch: bool = False, reuse: str | None = None, noiseless: bool = False,
            out: str = str(ROOT / "outputs/bench-figure-gan")) -> dict:
    """The four steps above on ``dataset`` (``n`` records drawn with ``seed``) at ``epsilon``; ``overrides`` are
    --set items of the grey recipe (e.g. ``train.seed=1``), ``paint_seed`` the painter's public seed, ``frechet``
    adds the evaluate stage's fid_classifier; sample grids (painted, grey) to ``grid_path``, ``grey_grid_path``.
    CPU and peak memory count this process and the CLI's stages. ``stretch``: each released grey sample is scaled
    by :func:`stretch_masks` before it is painted (post-processing); ``reuse``: the ``out`` folder of an earlier run
    whose release is painted again (no stage runs, nothing is spent); ``noiseless``: not private, the design's upper
    bound: the training records' own figure maps painted in place of a release. Returns the set's description and one row."""
    import utility
    from private_evolution import grid, records, score

    torch.set_num_threads(1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cpu0, wall0 = time.process_time(), time.monotonic()
    child_cpu0, _ = _children()
    cfg, train, fit_real, test_real, info = records(dataset, out, n, seed)
    rgb, _ = utility.import_dataset(dataset, out / dataset, n=n, seed=seed)
    full = read_parquet(str(rgb))
    grey = ImageDataset(record_ids=list(full.record_ids), labels=full.labels, images=figure_maps(full.images),
                        splits=full.splits, num_classes=full.num_classes,
                        source=f"{full.source} | benchmarks/figure_gan.py: figure maps")
    grey_uri = (Path(reuse) if reuse else out) / "grey" / f"{dataset}-figure-maps.parquet"
    if not reuse:
        grey_uri.parent.mkdir(parents=True, exist_ok=True)
        write_parquet(grey, grey_uri)

    extra = [*utility.GENERATED_EXTRA, f"data.num_classes={full.num_classes}", f"privacy.epsilon={epsilon}",
             "audit.empirical=off", *overrides]
    run_dir = (Path(reuse) if reuse else out) / "run"
    sets = ["--set", f"data.uri={grey_uri}", "--set", "tracking.enabled=false",
            "--set", f"ledger.url={utility.ledger_url(out)}", "--set", f"ledger.population_id={utility.POPULATION}"]
    for item in extra:
        sets += ["--set", item]
    if noiseless:
        reuse = "not private: the training records' own figure maps"  # nothing runs, nothing is spent
    if not reuse:
        utility.budget_for(out, grey_uri, [(RECIPE, epsilon)], extra)
    for stage in () if reuse else STAGES:
        subprocess.run([*utility.DPSYNTH, "-q", stage, "--config", str(ROOT / RECIPE), "--run-dir", str(run_dir),
                        *sets], cwd=ROOT, check=True)
    if noiseless:
        trained = audited = {"privacy": {"epsilon": None}, "details": {"method": None}}
        released = dataclasses.replace(train, images=figure_maps(train.images))
    else:
        trained = json.loads((run_dir / "sensitive/train/manifest.json").read_text())
        audited = json.loads((run_dir / "sensitive/audit/manifest.json").read_text())
        released = read_parquet(str(run_dir / "release/sample/synthetic.parquet"))
    cpu_release = (time.process_time() - cpu0 + _children()[0] - child_cpu0) / 60

    masks = released.images[..., 0].astype(np.float64) / 255.0
    masks = stretch_masks(masks) if stretch else masks
    images = paint(masks, np.random.default_rng(paint_seed), channels=3)
    synthetic = ImageDataset(record_ids=list(released.record_ids), labels=released.labels, images=images,
                             splits=None, num_classes=released.num_classes, source="figure maps, DP-GAN, painted")
    scores = score(cfg, synthetic, fit_real, test_real, frechet=frechet)
    if grid_path:
        grid(images, released.labels, released.num_classes, Path(grid_path))
    if grey_grid_path:
        grid(released.images, released.labels, released.num_classes, Path(grey_grid_path))
    child_cpu, child_rss = _children()
    row = {"row": "figure-gan", "recipe": RECIPE, "method": trained["details"].get("method"),
           "epsilon_target": epsilon, "delta": cfg.privacy.delta, "epsilon_trained": trained["privacy"]["epsilon"],
           "epsilon_audited": audited["details"].get("epsilon_upper_bound"), "audit": audited["details"],
           "overrides": list(overrides), "paint_seed": paint_seed, "stretch": stretch, "reused_release": reuse, "private_records": len(train),
           "test_records": len(test_real), "synthetic_records": len(synthetic), **scores,
           "cpu_min_release": cpu_release,
           "cpu_min_total": (time.process_time() - cpu0 + child_cpu - child_cpu0) / 60,
           "wall_min": (time.monotonic() - wall0) / 60,
           "peak_rss_gb": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, child_rss),
           "grid": grid_path, "grey_grid": grey_grid_path}
    return {**info, "recipe_settings": RECIPE, "rows": [row]}
