"""Retrain on new data: ``dpsynth_import_data`` imports a source into the configured dataset URI
(``DPSYNTH_DATASET_URI``) as a new version and updates its Asset; ``dpsynth_retrain_on_new_data`` is scheduled
on that Asset and runs the same pipeline as ``dpsynth_train`` with the form's defaults, on that version.

Versions (``dpsynth data import --versioned``, :mod:`dpsynth.data.versions`): each import also keeps its records,
immutable, at ``<dataset URI without .parquet>/<version>.parquet``, the version a keyed id of their content. The
asset event carries ``extra`` = {dataset_uri: that versioned URI, version}; the retrain run's ``plan`` reads it from
``triggering_asset_events``, so a retrain trains on the version that triggered it even if another import follows.
Every import emits an event; whether the data changed is decided by the retrain, against the version last
*released* for its population (its sample stage ran past a passed audit), not against the newest import: its
``start`` (``--unless-released``) opens no run and charges nothing when the version is that release, and
``data_changed`` skips the rest. An import whose run failed its audit released nothing, so importing the same records
again retrains; a second event for a version a queued retrain then releases is skipped when its turn comes.

Neither the event, the task's return value nor its log holds the records' content sha256 or counts
(``--outside``; the version is keyed, the key beside the versions in the sensitive zone's storage): Airflow's
database and logs are read outside the sensitive zone, and a raw digest of the records tells anyone who knows the
other records whether one is in them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow.sdk import Asset, Param, dag, task

sys.path.insert(0, str(Path(__file__).parent))  # the helper modules beside this file
import dpsynth_pods as pods  # noqa: E402
from dpsynth_pipeline import DATASET_URI, _run_local, params, pipeline  # noqa: E402


def asset_uri(uri: str) -> str:
    """s3://… as it is; a local path (relative to the repo) as file://…"""
    return uri if "://" in uri else (pods.REPO / uri).resolve().as_uri()


def import_args(source: str) -> list[str]:
    """``dpsynth data import``'s arguments: options first, then ``--`` and the two paths."""
    return ["--json", "--outside", "--versioned", "--", source, DATASET_URI]


DATASET = Asset(name=DATASET_URI, uri=asset_uri(DATASET_URI), group="dpsynth-dataset")


def dataset_event(imported: dict) -> dict:
    """The ``extra`` of the dataset's asset event: where the version is and its keyed id (no raw digest, no count).
    Emitted for records imported before too: the retrain compares the version with its population's last release."""
    return {"dataset_uri": imported["versioned_uri"], "version": imported["version"]}


# is_paused_upon_creation=False: a paused DAG drops the asset events an import emits, and the retrain never runs
@dag(dag_id="dpsynth_import_data", schedule=None, catchup=False, tags=["dpsynth"], doc_md=__doc__,
     default_args=pods.default_args(), is_paused_upon_creation=False,
     params={"source": Param("data/mnist", type="string", minLength=1,
                             description="anything `dpsynth data import` reads (local path or s3://)")})
def dpsynth_import_data():
    if pods.executor() == "kubernetes":
        # One argv element per value: the rendered source is a single argument, after "--" so that
        # it is never read as an option either.
        argv = ["dpsynth", "data", "import", *import_args("{{ params.source }}")]
        imported = pods.stage_pod_operator("import_data", "import", argv)

        @task(outlets=[DATASET])
        def dataset_updated(imported: dict, **context) -> None:
            context["outlet_events"][DATASET].extra = dataset_event(imported)

        dataset_updated(imported.output)
        return

    @task(outlets=[DATASET])
    def import_data(**context) -> dict:
        imported = _run_local(["data", "import", *import_args(context["params"]["source"])])
        context["outlet_events"][DATASET].extra = dataset_event(imported)
        return imported

    import_data()


@dag(dag_id="dpsynth_retrain_on_new_data", schedule=[DATASET], catchup=False, params=params(DATASET_URI),
     tags=["dpsynth"], doc_md=__doc__, max_active_runs=1, default_args=pods.default_args(),
     is_paused_upon_creation=False)
def dpsynth_retrain_on_new_data():
    pipeline()


dpsynth_import_data()
dpsynth_retrain_on_new_data()
