"""DAG ``dpsynth_train``: the six dpsynth stages under one MLflow parent run, from a trigger form.

Stage tasks run the stage CLI in the stage venv (``DPSYNTH_EXECUTOR=local``, the default) or as
Kubernetes pods of the stage image (``DPSYNTH_EXECUTOR=kubernetes``); see ``dpsynth_pods``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow.sdk import dag

sys.path.insert(0, str(Path(__file__).parent))  # the helper modules beside this file
import dpsynth_pods as pods  # noqa: E402
from dpsynth_pipeline import params, pipeline  # noqa: E402


@dag(dag_id="dpsynth_train", schedule=None, catchup=False, params=params(), tags=["dpsynth"],
     doc_md=__doc__, max_active_runs=4, default_args=pods.default_args(), is_paused_upon_creation=False)
def dpsynth_train():
    pipeline()


dpsynth_train()
