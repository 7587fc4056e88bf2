"""Utility benchmark (DPImageBench protocol): is the synthetic data any use to someone who trains on it?

For each recipe (a config in configs/) and each ε it runs the whole pipeline as a user would
(`dpsynth pipeline run`: partition with a 10% keyed-hash hold-out never trained on, pre-training,
private training, audit, sample, evaluate) on the bundled MNIST and reads the evaluate stage's
report: CNN gen2real accuracy on the held-out real records (trained on synthetic, epoch chosen on
synthetic validation, tested on real), logistic regression, fid_classifier, Inception Score; plus the
audited ε, CPU-minutes and wall time. Beside them, on the same held-out test records:

* ``nonprivate``: DPGAN's generator and discriminator trained *without* privacy (uniform batches,
  mean loss, no clipping, no noise) for the recipe's step budget;
* ``real``: the same CNN trained on the real training records (the ceiling);
* the published figures of each method's paper (CNN accuracy on MNIST at ε = 10 unless noted).

:func:`recipes` runs them (the suite ``utility``: ``make bench-utility``, all recipes at ε ∈ {1, 10}; a row of
benchmarks/suites.toml picks ``recipes``/``epsilons``). Not a test: it takes tens of CPU-minutes per recipe.

Generality (:func:`generality`, ``dataset=NAME``, a name of ``benchmarks/datasets.py``: letters, shapes, shapes-rgb, letters-rgb — development —
and symbols-rgb, greek, symbols — confirmation — or ``mnist``): the dataset is drawn by the benchmark (deterministic from
``seed``), written as an image folder and imported with ``dpsynth data import`` as a user would, then the
rows of ``rows``: ``default`` (the default recipe at each ε), ``ceiling`` (the same CNN on the real training
records), ``warmup`` (the warm-up alone: one private D step, fewer than n_D, so G is never stepped after its
fit), ``gan`` (the GAN phase alone: ``warmup.central_images=false``). It returns the set's description (naming
its role) and one entry per run; sample grids go to ``OUT/images/generality-NAME-ROW.png``. The suites
``generality``, ``keys`` and the recipe studies of benchmarks/suites.toml call it.

Every training attempt is charged to a privacy ledger, which gives no budget by default. The benchmark
keeps its own (``OUT/ledger.db``) and population (``mnist-bench``), and sets that population's budget
explicitly, with a reason, to what the planned runs need on top of what it has already charged
(:func:`budget_for`); a lifetime δ ≥ 1/n (too many runs on one ledger) is refused: use a new ``out``.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from dpsynth.config import load_config
from dpsynth.data import read_parquet
from dpsynth.evaluation import accuracy
from dpsynth.stages.evaluate import _split

ROOT = Path(__file__).resolve().parents[1]

RECIPES = {
    "dpgan": "configs/dpgan-mnist-cpu.yaml",
    "zhang": "configs/zhang-mnist-cpu.yaml",
    "gswgan": "configs/gswgan-mnist-cpu.yaml",
    "dpac": "configs/dpac-mnist-cpu.yaml",
    # the same methods after the private warm-up of the default recipe (dpsynth.warmup.fit)
    "zhang-warmup": "configs/zhang-warmup-mnist-cpu.yaml",
    "gswgan-warmup": "configs/gswgan-warmup-mnist-cpu.yaml",
    "dpac-warmup": "configs/dpac-warmup-mnist-cpu.yaml",
}
# Paper-scale recipes for one GPU (not in the default recipes): recipes="dpgan-gpu", overrides=["train.steps=N"]
GPU_RECIPES = {f"{m}-gpu": f"configs/{m}-mnist-gpu.yaml" for m in ("dpgan", "gswgan", "dpac", "zhang")}
# The recipe with no digit-specific settings (#32), chosen on the generality benchmark's development sets
# and the digit recipe, `make run`'s until 2026-11-28 (style templates sheared and thickened, a contrast layer)
OTHER_RECIPES = {"generic": "configs/dpgan-generic-cpu.yaml", "digits": "configs/dpgan-digits-cpu.yaml"}
ALL_RECIPES = {**RECIPES, **GPU_RECIPES, **OTHER_RECIPES}
# Published CNN accuracy on MNIST (%), read from the papers (seeds) and DPImageBench; full-size
# networks, 60k training images, hours of GPU.
PUBLISHED = {
    "dpgan": "93.0 (ε=10, n_D=50; Bie et al. Fig. 2a)",
    "gswgan": "≈80 (ε=10; Chen et al. 2020, as reported by Bie et al. Table 2)",
    "dpac": "above GS-WGAN (Chen et al. 2023)",
    "zhang": "not reported as CNN accuracy",
}


# Settings a recipe needs below some ε: below these ε the recipe's warm-up alone would not fit (the plan
# refuses; the config says so), so these releases are left out.
# The digit recipe: the three releases spend ε ≈ 9.68, the first two 6.69 (σ_s = 0.75, σ_v = 0.8).
# dp-GAN's warm-up recipe: ε ≈ 7.2 and 4.8 (σ_s = σ_v = 1).
DPGAN_RELEASES = [(9.8, ["warmup.variations=0"]), (7.0, ["warmup.styles=0"])]
THREE_RELEASES = [(8.0, ["warmup.variations=0"]), (6.0, ["warmup.styles=0"])]
# the generic and the default recipe need none: they leave out what does not fit themselves (warmup.fit_epsilon:
# their releases spend ε ≈ 8.89; the generic one's without variations 1.66, without the polarity shapes too 0.82)
BELOW_EPSILON = {"digits": DPGAN_RELEASES, "zhang-warmup": THREE_RELEASES}


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


DPSYNTH = [sys.executable, "-m", "dpsynth"]  # the command a user runs, with this interpreter
POPULATION = "mnist-bench"  # the benchmark's own population, in its own ledger


def ledger_url(out: Path) -> str:
    return f"sqlite:///{out.resolve()}/ledger.db"


def budget_for(out: Path, dataset: Path, plan: list[tuple[str, float]], extra: list[str]) -> dict:
    """Set the benchmark population's lifetime budget to what is charged already plus the (ε, δ) of every
    planned run (a re-run reuses finished stages and is charged nothing more, but each run's start checks
    that its target is affordable); returns the balance."""
    import pyarrow.parquet as pq

    from dpsynth.ledger.store import Ledger

    ledger = Ledger(ledger_url(out))
    cfgs = [load_config(ROOT / recipe, overrides=[f"privacy.epsilon={eps}", *extra]) for recipe, eps in plan]
    known = {p["population_id"]: p for p in ledger.populations()}
    charged = known.get(POPULATION, {"committed": 0.0, "reserved": 0.0, "delta_used": 0.0})
    return ledger.set_budget(
        POPULATION, epsilon=charged["committed"] + charged["reserved"] + sum(c.privacy.epsilon for c in cfgs),
        delta=charged["delta_used"] + sum(c.privacy.delta for c in cfgs), records=pq.ParquetFile(dataset).metadata.num_rows,
        reason=f"benchmarks/utility.py: {len(plan)} planned run(s) "
               + ", ".join(f"{Path(r).stem} ε={e:g}" for r, e in plan))


def run_pipeline(name: str, eps: float, out: Path, dataset: Path, extra: list[str], tag: str = "") -> dict:
    recipe = ALL_RECIPES[name]
    run_dir = out / f"{Path(recipe).stem}-eps{eps:g}{tag}"
    cmd = [*DPSYNTH, "pipeline", "run", "--config", str(ROOT / recipe),
           "--run-dir", str(run_dir), "--set", f"data.uri={dataset}", "--set", f"privacy.epsilon={eps}",
           "--set", "tracking.enabled=false", "--set", f"ledger.url={ledger_url(out)}",
           "--set", f"ledger.population_id={POPULATION}"]
    dropped = [item for below, settings in BELOW_EPSILON.get(name, []) if eps < below for item in settings]
    for item in [*dropped, *extra]:
        cmd += ["--set", item]
    cpu0, t0 = cpu_children(), time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall, cpu = time.monotonic() - t0, cpu_children() - cpu0
    if proc.returncode != 0:
        return {"recipe": recipe, "epsilon_target": eps, "error": proc.stderr[-2000:], "wall_s": wall}
    report = json.loads((run_dir / "release/evaluate/report.json").read_text())
    rows = {r["classifier"]: r for r in report["utility"]["classifiers"]}
    q = report["quality"]
    return {"recipe": recipe, "epsilon_target": eps, "epsilon_audited": report["privacy"]["epsilon"],
            "cnn_gen2real": rows["cnn"].get("gen2real"), "logreg_gen2real": rows.get("logreg", {}).get("gen2real"),
            "cnn_real": rows["cnn"].get("real"), q["frechet"]["name"]: q["frechet"]["value"],
            "frechet_real_vs_real": q["frechet"]["real_vs_real"], "inception_score": q["inception_score"]["mean"],
            "cpu_min": cpu / 60, "wall_min": wall / 60, "run_dir": str(run_dir)}


def heldout_split(run_dir: Path, cfg):
    heldout = read_parquet(str(run_dir / "sensitive/partition/heldout.parquet"))
    fit_idx, test_idx = _split(len(heldout), fraction=0.5, seed=cfg.evaluate.seed)
    return heldout.subset(fit_idx), heldout.subset(test_idx)


def baselines_for(run_dir: Path, recipe: str, steps: int) -> list[dict]:
    """Non-private DPGAN models on the same step budget, and real data, on the run's test records."""
    import numpy as np

    from dpgan_ablation import run_arm
    from dpsynth.data import ImageDataset

    cfg = load_config(ROOT / recipe)
    fit_real, test_real = heldout_split(run_dir, cfg)
    shard = read_parquet(str(next((run_dir / "sensitive/partition").glob("shard-*.parquet"))))
    out = []
    x, y = shard.to_tensors()
    tx, ty = test_real.to_tensors()
    cpu0 = time.process_time()
    G = run_arm("plain", x, y, tx, ty, steps=steps, B=cfg.train.batch_size, width=cfg.train.g_width, C=1.0,
                sigma=0.0, seed=0, log_every=max(1, steps // 4), return_generator=True)
    with torch.no_grad():
        labels = torch.arange(10000) % shard.num_classes
        gx, gy = G.sample(len(labels), labels=labels, generator=torch.Generator().manual_seed(0))
    pixels = ((gx.permute(0, 2, 3, 1).numpy() + 1) * 127.5).round().clip(0, 255).astype(np.uint8)
    synthetic = ImageDataset(record_ids=[f"s{i}" for i in range(len(gy))], labels=gy.numpy(), images=pixels,
                             splits=None, num_classes=shard.num_classes, source="nonprivate baseline")
    val, tr = _split(len(synthetic), fraction=cfg.evaluate.validation_fraction, seed=cfg.evaluate.seed)
    u = accuracy.utility(cfg, synthetic=synthetic.subset(tr), validation=synthetic.subset(val), fit_real=fit_real,
                         test_real=test_real, names=("cnn", "logreg"))
    rows = {r["classifier"]: r for r in u["classifiers"]}
    out.append({"recipe": f"nonprivate DPGAN models, {steps} steps", "cnn_gen2real": rows["cnn"]["gen2real"],
                "logreg_gen2real": rows["logreg"]["gen2real"], "cpu_min": (time.process_time() - cpu0) / 60})
    out.append(ceiling(run_dir, recipe))
    return out


def ceiling(run_dir: Path, recipe: str, extra: list[str] = ()) -> dict:
    """The same CNN (and logistic regression) trained on the run's real training records, tested on its
    held-out test records: what a release could reach at best."""
    cfg = load_config(ROOT / recipe, overrides=list(extra))
    fit_real, test_real = heldout_split(run_dir, cfg)
    shard = read_parquet(str(next((run_dir / "sensitive/partition").glob("shard-*.parquet"))))
    cpu0 = time.process_time()
    val, tr = _split(len(shard), fraction=cfg.evaluate.validation_fraction, seed=cfg.evaluate.seed)
    u = accuracy.utility(cfg, synthetic=shard.subset(tr), validation=shard.subset(val), fit_real=fit_real,
                         test_real=test_real, names=("cnn", "logreg"))
    rows = {r["classifier"]: r for r in u["classifiers"]}
    return {"recipe": f"real training records ({len(shard)}), the ceiling", "cnn_gen2real": rows["cnn"]["gen2real"],
            "logreg_gen2real": rows["logreg"]["gen2real"], "cpu_min": (time.process_time() - cpu0) / 60,
            "test_records": len(test_real)}


def markdown(rows: list[dict]) -> str:
    head = "| run | ε target | ε audited | CNN gen2real | logreg gen2real | fid_classifier (real-vs-real) | IS | CPU-min | wall-min | published |"
    lines = [head, "|" + "---|" * 10]
    f = lambda v, p=3: "—" if v is None else (f"{v:.{p}f}" if isinstance(v, float) else str(v))  # noqa: E731
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['recipe']} | {r['epsilon_target']} | failed: {r['error'][-120:]!r} |" + " |" * 7)
            continue
        fid = r.get("fid_classifier")
        fid_s = "—" if fid is None else f"{fid:.1f} ({r['frechet_real_vs_real']:.1f})"
        method = Path(r["recipe"]).stem.split("-")[0]
        lines.append(f"| {r['recipe']} | {f(r.get('epsilon_target'), 0)} | {f(r.get('epsilon_audited'))} | "
                     f"{f(r.get('cnn_gen2real'))} | {f(r.get('logreg_gen2real'))} | {fid_s} | {f(r.get('inception_score'), 2)} | "
                     f"{f(r.get('cpu_min'), 1)} | {f(r.get('wall_min'), 1)} | {PUBLISHED.get(method, '')} |")
    return "\n".join(lines) + "\n"


def generality_markdown(rows: list[dict]) -> str:
    """One line per generality row, with CNN accuracy as a share of the set's ceiling."""
    top = next((r["cnn_gen2real"] for r in rows if r.get("row") == "ceiling"), None)
    lines = ["| row | ε target | ε audited | CNN gen2real | % of ceiling | logreg gen2real | fid_classifier (real-vs-real) "
             "| IS | CPU-min | wall-min | sample grid |", "|" + "---|" * 11]
    f = lambda v, p=3: "—" if v is None else (f"{v:.{p}f}" if isinstance(v, float) else str(v))  # noqa: E731
    for r in rows:
        what = r.get("what", r["recipe"])
        if "error" in r:
            lines.append(f"| {what} | {r['epsilon_target']:g} | failed: {r['error'][-160:]!r} |" + " |" * 8)
            continue
        fid = r.get("fid_classifier")
        fid_s = "—" if fid is None else f"{fid:.1f} ({r['frechet_real_vs_real']:.1f})"
        share = "—" if top is None or r.get("cnn_gen2real") is None else f"{100 * r['cnn_gen2real'] / top:.0f}%"
        grid = f"[png](../../{r['grid']})" if r.get("grid") else ""
        lines.append(f"| {what} | {f(r.get('epsilon_target'), 0)} | {f(r.get('epsilon_audited'))} | {f(r.get('cnn_gen2real'))} | "
                     f"{share} | {f(r.get('logreg_gen2real'))} | {fid_s} | {f(r.get('inception_score'), 2)} | "
                     f"{f(r.get('cpu_min'), 1)} | {f(r.get('wall_min'), 1)} | {grid} |")
    return "\n".join(lines) + "\n"


GENERATED_EXTRA = ["data.heldout_fraction=0.2"]  # generated sets are small: 20% held out, half of it the test set
ROWS = ("default", "ceiling", "warmup", "gan")
# the warm-up alone: 1 private step, and the recipe's 4,000-step fit (a null warmup.steps would follow train.steps)
ROW_SETTINGS = {"default": [], "warmup": ["train.steps=1", "warmup.steps=4000"], "gan": ["warmup.central_images=false"]}
ROW_TEXT = {"default": "default release", "warmup": "warm-up alone (1 D step < n_D: G as fitted)",
            "gan": "GAN phase alone (no warm-up)"}


def import_dataset(name: str, out: Path, *, n: int, seed: int) -> tuple[Path, dict]:
    """The benchmark's dataset ``name`` as a user brings it: drawn into an image folder (mnist: the bundled
    IDX files), then ``dpsynth data import`` to Parquet. Returns the Parquet path and the set's description."""
    import datasets

    parquet = out / f"data/{name}.parquet"
    if name == "mnist":
        src, info = ROOT / "data/mnist", {"dataset": "mnist", "role": "development (the recipe was tuned on it)"}
    else:
        src = out / f"folders/{name}-n{n}-seed{seed}"
        marker = src / ".complete.json"
        if not marker.exists():
            info = datasets.write_folder(name, src, n=n, seed=seed)
            marker.write_text(json.dumps(info))
        info = json.loads(marker.read_text())
    if not parquet.exists():
        parquet.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([*DPSYNTH, "data", "import", str(src), str(parquet)],
                       cwd=ROOT, check=True)
    return parquet, info


def generality(*, dataset: str, recipe: str = "dpgan", rows: str = ",".join(ROWS), epsilons: str = "10,1", n: int = 6000,
               seed: int = 0, overrides: list[str] = (), out: str = str(ROOT / "outputs/bench-generality"),
               images: str | None = None) -> dict:
    """The ``rows`` (of ROWS; ``none``: only draw and import the set) of ``recipe`` on the benchmark's dataset
    ``dataset`` (mnist, or a name of datasets.py; ``n`` records drawn with ``seed``), ``overrides`` the --set items
    of every run; sample grids to ``images`` (default: OUT/images). Returns the set's description and its rows
    (see the module's docstring)."""
    import shutil

    if recipe not in ALL_RECIPES:
        raise ValueError(f"recipe: {recipe!r} is not one of {', '.join(ALL_RECIPES)}")
    name = dataset
    out = Path(out) / name
    images = Path(images) if images else out / "images"
    out.mkdir(parents=True, exist_ok=True)
    dataset, info = import_dataset(name, out, n=n, seed=seed)
    # the label set is public and declared, never read off the records (data.num_classes, #33): the benchmark
    # drew the set, so it knows its classes
    classes = [f"data.num_classes={read_parquet(str(dataset)).num_classes}"]
    extra = ([] if name == "mnist" else GENERATED_EXTRA) + classes + list(overrides)
    rows_wanted = rows.split(",")
    if rows_wanted == ["none"]:  # only draw and import the set
        print(json.dumps(info))
        return info
    unknown = sorted(set(rows_wanted) - set(ROWS))
    if unknown:
        raise ValueError(f"rows: unknown {unknown}; choose from {', '.join(ROWS)}")
    epsilons = [float(e) for e in epsilons.split(",")]
    runs = [("default", eps) for eps in epsilons if "default" in rows_wanted]
    runs += [(r, 10.0) for r in ("warmup", "gan") if r in rows_wanted]
    if "ceiling" in rows_wanted and not runs:
        runs = [("default", 10.0)]  # the ceiling needs a run's partition
    budget_for(out, dataset, [(ALL_RECIPES[recipe], eps) for _, eps in runs], extra)
    suffix = "" if recipe == "dpgan" else f"-{recipe}"
    images.mkdir(parents=True, exist_ok=True)
    rows = []

    for row, eps in runs:
        tag = "" if row == "default" else f"-{row}"
        r = run_pipeline(recipe, eps, out, dataset, [*extra, *ROW_SETTINGS[row]], tag=tag)
        r = {"dataset": name, "role": info["role"], "row": row, "what": ROW_TEXT[row], **r}
        if "error" not in r:
            r["method"] = json.loads((Path(r["run_dir"]) / "sensitive/train/manifest.json").read_text())["details"]["method"]
            if r["method"] == "private-evolution":  # what train.method: auto picked for a colour schema: name the prior
                from dpsynth import prior
                r["what"] += f" (Private Evolution on the public prior, version {prior.VERSION})"
            grid = images / f"generality-{name}{suffix}-{row}-eps{eps:g}.png"
            shutil.copyfile(Path(r["run_dir"]) / "release/sample/samples.png", grid)
            r["grid"] = str(grid.relative_to(ROOT)) if grid.is_relative_to(ROOT) else str(grid)
        print(json.dumps(r), flush=True)
        rows.append(r)
        if "ceiling" in rows_wanted and not any(x.get("row") == "ceiling" for x in rows) and "error" not in r:
            c = {"dataset": name, "role": info["role"], "row": "ceiling",
                 **ceiling(Path(r["run_dir"]), ALL_RECIPES[recipe], extra)}
            print(json.dumps(c), flush=True)
            rows.append(c)
        if row == "default" and eps == 10.0 and "default" not in rows_wanted:
            rows.remove(r)  # run only for the ceiling's partition
    print(generality_markdown(rows))
    return {**info, "rows": rows}


def recipes(*, recipes: str = ",".join(RECIPES), epsilons: str = "10,1", dataset: str | None = None,
            out: str = str(ROOT / "outputs/bench-utility"), baselines: bool = False,
            overrides: list[str] = ()) -> list[dict]:
    """Each of ``recipes`` (comma-separated, of ALL_RECIPES) at each of ``epsilons`` through the pipeline on
    ``dataset`` (a Parquet file; default: the bundled MNIST, imported into OUT/data), ``overrides`` the --set items
    of every run; ``baselines``: also the non-private and real-data rows. Returns one row per run."""
    unknown = sorted(set(recipes.split(",")) - set(ALL_RECIPES))
    if unknown:
        raise ValueError(f"recipes: {unknown} not of {', '.join(ALL_RECIPES)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if dataset is None:
        dataset = out / "data/mnist.parquet"
        if not dataset.exists():
            dataset.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([*DPSYNTH, "data", "import", str(ROOT / "data/mnist"), str(dataset)], cwd=ROOT, check=True)
    extra = list(overrides)
    rows = []
    plan = [(ALL_RECIPES[name], float(e)) for name in recipes.split(",") for e in epsilons.split(",")]
    balance = budget_for(out, Path(dataset), plan, extra)
    print(f"ledger {ledger_url(out)}: population {POPULATION} budget ε={balance['budget']:g}, "
          f"δ={balance['delta']:g} (remaining ε={balance['remaining']:g})", flush=True)
    for name in recipes.split(","):
        for eps in (float(e) for e in epsilons.split(",")):
            row = run_pipeline(name, eps, out, Path(dataset), extra)
            print(json.dumps(row), flush=True)
            rows.append(row)
        if baselines and name == "dpgan" and "error" not in rows[-1]:
            cfg = load_config(ROOT / RECIPES[name])
            for row in baselines_for(Path(rows[-1]["run_dir"]), RECIPES[name], cfg.train.steps):
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(markdown(rows))
    return rows
