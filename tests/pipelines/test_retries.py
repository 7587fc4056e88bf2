"""Retries never repeat a verdict (issue #34): a stage that exits 2 (dpsynth's status for a DpsynthError: bad input,
a refused budget, a failed audit) fails its Airflow task with AirflowFailException, locally and in a pod, and the
audit task is never retried (a failing randomised gate must not get three draws). In KFP, whose retry policy has no
exit-status filter, the audit and finish carry no retry policy (test_kfp.py) and the containers' program records a
verdict so that a retry does not run the stage again (test_kfp_exit.py)."""

from __future__ import annotations

import stat

from tests.airflow_fixtures import LOAD, in_airflow


def fake_stage(tmp_path, code: int):
    script = tmp_path / f"dpsynth-exit-{code}"
    script.write_text(f"#!/bin/sh\necho 'dpsynth: error: privacy.epsilon: bad' >&2\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_a_verdict_is_not_retried(airflow_env, tmp_path):
    env = {**airflow_env, "DPSYNTH_STAGE_BIN": fake_stage(tmp_path, 2)}
    out = in_airflow(LOAD + f"""
    import dpsynth_pipeline, dpsynth_pods
    from kubernetes.client import models as k8s
    def raised(call):
        try:
            call()
        except Exception as exc:
            return [type(exc).__name__, str(exc)]
    def pod(code):
        state = k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(exit_code=code))
        return k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="p"), status=k8s.V1PodStatus(phase="Failed",
                         container_statuses=[k8s.V1ContainerStatus(name="base", state=state, image="i", image_id="",
                                                                   ready=False, restart_count=0)]))
    Op = dpsynth_pods.stage_pod_operator_class()
    op = Op(task_id="train", name="t", image="i", do_xcom_push=False, on_finish_action="keep_pod", in_cluster=True)
    op.process_pod_deletion = lambda *a, **k: None
    op.patch_already_checked = lambda *a, **k: None
    op.log_events_on_failure = False
    op.is_istio_enabled = lambda *a, **k: False  # (reads the namespace from the API server)
    train = bag.dags["dpsynth_train"]
    print(json.dumps({{
        "local_2": raised(lambda: dpsynth_pipeline._run_local(["train", "--json"])),
        "local_1": raised(lambda: (os.environ.__setitem__("DPSYNTH_STAGE_BIN", {fake_stage(tmp_path, 1)!r}),
                                   dpsynth_pipeline._run_local(["train", "--json"]))),
        "pod_2": raised(lambda: op.cleanup(pod(2), pod(2))),
        "pod_1": raised(lambda: op.cleanup(pod(1), pod(1))),
        "retries": {{t.task_id: t.retries for t in train.tasks}},
    }}))
    """.replace("import dpsynth_pipeline", "import os, dpsynth_pipeline"), env)
    assert out["local_2"][0] == "AirflowFailException" and "exited 2" in out["local_2"][1], out
    assert "privacy.epsilon: bad" in out["local_2"][1]
    assert out["local_1"][0] == "RuntimeError"  # anything else: retried
    assert out["pod_2"][0] == "AirflowFailException" and "not retried" in out["pod_2"][1], out
    assert out["pod_1"][0] == "AirflowException", out
    assert out["retries"]["audit"] == 0 and out["retries"]["finish"] == 0 and out["retries"]["train"] == 2
