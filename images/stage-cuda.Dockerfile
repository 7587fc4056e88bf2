# The stage image, CUDA: same entrypoint as stage-cpu, with torch built for CUDA 12.8
# (pinned in images/stage-cuda.constraints). The GPU stages (pretrain, train) run in it.
# Build from the repository root:  buildah bud --isolation chroot -f images/stage-cuda.Dockerfile -t dpsynth-stage:cuda .
ARG BASE_IMAGE=docker.io/nvidia/cuda:12.8.1-runtime-ubuntu24.04
FROM ${BASE_IMAGE}
# No Chromium here (Ubuntu ships it as a snap only): the release card's PDF is printed by the sample stage, which runs
# in the CPU image (values-gpu.yaml gives this image to the GPU stages only).

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG PYTHON=python3.11
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/dpsynth PATH=/opt/dpsynth/bin:$PATH \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true

# The nvidia/cuda images carry no Python 3.11; take it from the deadsnakes PPA on Ubuntu
# (or use a base that has it and pass --build-arg PYTHON=python3).
RUN if ! command -v "${PYTHON}" >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends software-properties-common && \
      add-apt-repository -y ppa:deadsnakes/ppa && apt-get update && \
      apt-get install -y --no-install-recommends "${PYTHON}" "${PYTHON}-venv" && \
      rm -rf /var/lib/apt/lists/*; fi && \
    "${PYTHON}" -m venv /opt/dpsynth

# torch first, the CUDA build; then the rest of stage.lock without its CPU torch line.
COPY images/stage-cuda.constraints /tmp/stage-cuda.constraints
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" -r /tmp/stage-cuda.constraints
# The production lock: stage.lock without the test-only packages (scripts/prod_lock.py)
COPY requirements/stage-prod.lock /tmp/stage.lock
RUN grep -v '^torch==' /tmp/stage.lock > /tmp/stage-notorch.lock && \
    pip install --extra-index-url "${TORCH_INDEX_URL}" -c /tmp/stage-cuda.constraints -r /tmp/stage-notorch.lock

COPY pyproject.toml README.md /src/
COPY components /src/components
# The MLflow plugin: lineage tags (a run-context provider) and the auditors' "Privacy ledger" page
# (`mlflow server --app-name dpsynth-ledger`).
COPY mlflow_plugins /src/mlflow_plugins
# PostgreSQL driver for `mlflow server` (the chart runs MLflow from this image) and the ledger's
# postgresql+psycopg2:// URL (also in stage.lock, for `make up`); PG_DRIVER swaps it, e.g. for a source-built psycopg2.
ARG PG_DRIVER=psycopg2-binary==2.9.13
RUN pip install "${PG_DRIVER}" && pip install --no-deps /src /src/mlflow_plugins && rm -rf /src /tmp/stage*.lock /tmp/stage-cuda.constraints

# The recipes (configs/), where the pipelines' default base config points: the trigger form's `config`
# (the chart's pipeline.config) and the KFP pipeline's `config` input, /opt/dpsynth/configs/dpgan-mnist-cpu.yaml.
COPY configs /opt/dpsynth/configs

# The commit the image was built from (scripts/build_image.sh passes `git rev-parse HEAD`): an OCI label, and the
# environment, so a stage can name its code even where the pod spec sets no DPSYNTH_IMAGE.
ARG GIT_SHA=unknown
LABEL org.opencontainers.image.revision="${GIT_SHA}" org.opencontainers.image.source="dpsynth"
ENV DPSYNTH_GIT_SHA=${GIT_SHA}

RUN useradd --create-home --uid 10001 dpsynth
USER 10001
WORKDIR /home/dpsynth
ENTRYPOINT ["dpsynth"]
CMD ["--help"]
