# Sourced by the benchmarks/device_*.sh scripts, from the repository root. On a bare GPU machine with torch but not
# opacus / prv-accountant / pydantic / mlflow, it installs the Python 3.12 wheels carried in .whl/ (an ignored folder
# of the repository root, built with `pip download --python-version 3.12 --only-binary=:all:`) into /tmp/site;
# NO_WHEELS=1 skips that (a machine that has them, e.g. with the stage venv's python first on PATH). Then the repo's
# packages go on PYTHONPATH and every process gets one CPU thread (the runs go side by side).
if [ -z "${NO_WHEELS:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/components:$PWD/mlflow_plugins${PYTHONPATH:+:$PYTHONPATH}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1 TQDM_DISABLE=1
