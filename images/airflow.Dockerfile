# The Airflow image: apache-airflow 3.3.2 + the cncf-kubernetes provider from requirements/airflow.lock,
# with the dpsynth DAGs baked in. Stages do not run here: the DAGs launch them as pods of the stage image
# (DPSYNTH_EXECUTOR=kubernetes). Used by the upstream Airflow chart (charts/dpsynth/values-airflow.yaml).
# Build from the repository root:  buildah bud --isolation chroot -f images/airflow.Dockerfile -t dpsynth-airflow:latest .
ARG BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/airflow-venv PATH=/opt/airflow-venv/bin:$PATH \
    AIRFLOW_HOME=/opt/airflow AIRFLOW__CORE__DAGS_FOLDER=/opt/airflow/dags \
    AIRFLOW__CORE__LOAD_EXAMPLES=False DPSYNTH_EXECUTOR=kubernetes DPSYNTH_REPO=/opt/airflow

RUN python3 -m venv /opt/airflow-venv
COPY requirements/airflow.lock /tmp/airflow.lock
RUN pip install -r /tmp/airflow.lock && rm /tmp/airflow.lock

# The upstream chart runs as uid 50000, gid 0.
RUN useradd --create-home --uid 50000 --gid 0 --home-dir /home/airflow airflow && \
    mkdir -p /opt/airflow/dags /opt/airflow/logs && chown -R 50000:0 /opt/airflow
COPY --chown=50000:0 pipelines/airflow/dags /opt/airflow/dags
USER 50000
WORKDIR /opt/airflow
ENTRYPOINT ["airflow"]
CMD ["version"]
