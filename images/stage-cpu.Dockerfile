# The stage image, CPU: `dpsynth <stage> ...` (partition|pretrain|train|audit|sample|evaluate|pipeline).
# Build from the repository root:  buildah bud --isolation chroot -f images/stage-cpu.Dockerfile -t dpsynth-stage:cpu .
# The base must have Python 3.11 with pip and venv (see images/README.md for a debootstrap-made one).
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# stage.lock pins torch==2.13.0+cpu, a local version only the PyTorch CPU index serves.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# A directory of wheels mounted into the build (`buildah bud -v DIR:/wheels:ro --build-arg PIP_FIND_LINKS=/wheels`),
# for builds without the PyTorch index; pip reads it from the environment.
ARG PIP_FIND_LINKS
# A CA bundle mounted into the build, for networks that intercept TLS (pip reads PIP_CERT).
ARG PIP_CERT
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/dpsynth PATH=/opt/dpsynth/bin:$PATH \
    MLFLOW_DISABLE_TELEMETRY=true DO_NOT_TRACK=true

# Headless Chromium prints the release card's PDF (dpsynth.release.card.pdf; without it the card is HTML only).
# CHROMIUM="" leaves it out (a base without apt, or an image that never runs the sample stage).
ARG CHROMIUM="chromium fonts-dejavu-core"
RUN if [ -n "${CHROMIUM}" ]; then apt-get update && apt-get install -y --no-install-recommends ${CHROMIUM} && \
        rm -rf /var/lib/apt/lists/*; fi

RUN python3 -m venv /opt/dpsynth
# The production lock: stage.lock without the test-only packages (scripts/prod_lock.py)
COPY requirements/stage-prod.lock /tmp/stage.lock
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" -r /tmp/stage.lock

COPY pyproject.toml README.md /src/
COPY components /src/components
# The MLflow plugin: lineage tags (a run-context provider) and the auditors' "Privacy ledger" page
# (`mlflow server --app-name dpsynth-ledger`).
COPY mlflow_plugins /src/mlflow_plugins
# PostgreSQL driver for `mlflow server` (the chart runs MLflow from this image) and the ledger's
# postgresql:// URL (also in stage.lock, for `make up`); PG_DRIVER swaps it, e.g. for a source-built psycopg2.
ARG PG_DRIVER=psycopg2-binary==2.9.13
RUN pip install "${PG_DRIVER}" && pip install --no-deps /src /src/mlflow_plugins && rm -rf /src /tmp/stage.lock

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
