"""Run ``local_pipeline`` (the KFP pipeline's shape, stages as local subprocesses) with ``kfp.local``.

    python pipelines/kfp/run_local.py --dataset outputs/data/mnist.parquet --run-dir outputs/kfp \\
        --config configs/dpgan-mnist-cpu.yaml --steps 200

``--config`` (a YAML file) is the pipeline's ``config`` input and ``--set section.field=value`` its ``extra``;
the pipeline parameters (dataset, population id, method, ε, δ, steps, K, n_D, seed, the empirical audit) are
passed only when given (else the config's). The population id (``ledger.population_id``) is required:
its lifetime budget, set beforehand with ``dpsynth ledger set-budget`` (``make run-kfp`` does it for the
bundled MNIST), is charged for every training attempt, in the ledger beside the SQLite MLflow store or
the local run directory (or ``ledger.url``, ``$DPSYNTH_LEDGER_URL``).
"""

import argparse
import builtins
import importlib.util
import os
import sys
from pathlib import Path

from kfp import local


def _sibling(name: str, as_name: str):
    """pipelines/kfp/NAME.py as module AS_NAME (pipelines/ is no package; airflow/dags has a namesake)."""
    if as_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(as_name, Path(__file__).with_name(f"{name}.py"))
        sys.modules[as_name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[as_name]


kp = _sibling("dpsynth_pipeline", "dpsynth_kfp_pipeline")
SETTINGS, local_pipeline = {**kp.SETTINGS, **kp.LAUNCH}, kp.local_pipeline  # LAUNCH: the train stage's shape


def run(*, dataset: str, run_dir: str, extra: list[str], pipeline_root: str | None = None, config: str = "",
        **params):
    """Run the local pipeline to the end; raises when a task fails. Returns kfp.local's outputs. ``config``: the
    base config file ("": none); ``params``: the pipeline's settings inputs, each left out (None) for the
    config's."""
    run_dir = str(Path(run_dir).resolve()) if "://" not in run_dir else run_dir
    root = pipeline_root or os.path.join(run_dir if "://" not in run_dir else ".", "kfp-local")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root, raise_on_error=True)
    original_print = builtins.print
    try:
        # the local flavour takes the settings given as extra items (kfp.local cannot leave an optional input out)
        given = [f"{SETTINGS[k]}={v}" for k, v in params.items() if v is not None and k != "population_id"]
        return local_pipeline(dataset_uri=dataset, run_dir=run_dir, population_id=params["population_id"],
                              extra=[*given, *extra], config=config)
    finally:
        # kfp.local indents task logs by swapping builtins.print; with ParallelFor iterations running in
        # threads the swaps interleave and an indenting print can be left behind (kfp 2.17.0)
        builtins.print = original_print


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", required=True, help="canonical Parquet dataset URI")
    ap.add_argument("--run-dir", required=True, help="root of the pipeline run, local or s3://")
    ap.add_argument("--config", help="YAML config file, the run's base (as the pipeline's config input)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    ap.add_argument("--population-id", help="ledger.population_id (default: the config's; required)")
    ap.add_argument("--method")
    ap.add_argument("--epsilon", type=float)
    ap.add_argument("--delta", type=float)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--num-shards", type=int)
    ap.add_argument("--n-d")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--audit-empirical", choices=["off", "quick", "full"], help="audit.empirical (default: the config's)")
    a = ap.parse_args(argv)
    from dpsynth.methods.registry import load_config  # the configuration with its method's rules

    given = {k: v for k, v in vars(a).items() if k in SETTINGS and v is not None}
    sets = [f"{SETTINGS[k]}={v}" for k, v in given.items()]
    sets += [f"ledger.population_id={a.population_id}"] if a.population_id else []  # an input of the local flavour
    cfg = load_config(a.config, overrides=[f"data.uri={a.dataset}", *sets, *a.overrides])  # validates, names a field
    given["population_id"] = cfg.ledger.population_id
    if not given["population_id"]:
        ap.error("ledger.population_id: required (--population-id, or in --config): the population whose "
                 "lifetime privacy budget the run is charged")
    config = str(Path(a.config).resolve()) if a.config else ""
    run(dataset=a.dataset, run_dir=a.run_dir, extra=a.overrides, config=config, **given)
    print(f"run directory: {a.run_dir} (release/sample, release/evaluate); MLflow: see the finish task's table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
