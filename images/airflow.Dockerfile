# The Airflow image: apache-airflow 3.3.2 + the cncf-kubernetes provider from requirements/airflow.lock,
# with the dpsynth DAGs baked in. Stages do not run here: the DAGs launch them as pods of the stage image
# (DPSYNTH_EXECUTOR=kubernetes). Used by the upstream Airflow chart (charts/dpsynth/values-airflow.yaml),
# so it follows the official apache/airflow image's conventions: dumb-init + /entrypoint (runs `bash ...`,
# `python ...`, `airflow ...` or an airflow sub-command), /clean-logs for the log groomer, AIRFLOW_HOME
# /opt/airflow, uid 50000 with gid 0 (any uid works with gid 0), empty CMD.
# Build from the repository root:  buildah bud --isolation chroot -f images/airflow.Dockerfile -t dpsynth-airflow:latest .
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

# dumb-init as PID 1 (the official image installs Debian's; this wheel works on any base with pip).
ARG DUMB_INIT=dumb-init==1.2.5.post1
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/airflow-venv PATH=/opt/airflow-venv/bin:$PATH \
    AIRFLOW_HOME=/opt/airflow AIRFLOW__CORE__DAGS_FOLDER=/opt/airflow/dags \
    AIRFLOW__CORE__LOAD_EXAMPLES=False DPSYNTH_EXECUTOR=kubernetes DPSYNTH_REPO=/opt/airflow \
    DUMB_INIT_SETSID=1 DO_NOT_TRACK=true

RUN python3 -m venv /opt/airflow-venv
COPY requirements/airflow.lock /tmp/airflow.lock
RUN pip install -r /tmp/airflow.lock "${DUMB_INIT}" && rm /tmp/airflow.lock

COPY --chmod=755 images/airflow-entrypoint.sh /entrypoint
COPY --chmod=755 images/airflow-clean-logs.sh /clean-logs

# The upstream chart runs as uid 50000, gid 0; group 0 may write what the airflow user may write.
RUN useradd --create-home --uid 50000 --gid 0 --home-dir /home/airflow airflow && \
    mkdir -p /opt/airflow/dags /opt/airflow/logs && chown -R 50000:0 /opt/airflow /home/airflow && \
    chmod -R g+rwX /opt/airflow /home/airflow
COPY --chown=50000:0 pipelines/airflow/dags /opt/airflow/dags
USER 50000
WORKDIR /opt/airflow
ENTRYPOINT ["/opt/airflow-venv/bin/dumb-init", "--", "/entrypoint"]
CMD []
