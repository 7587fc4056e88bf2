"""A parse of the DAG files looks each Airflow Variable up once (issue #34 item 7): in Kubernetes mode every pod's
settings were looked up per pod, 274 metadata-database reads for 24 names per parse of the folder before."""

from __future__ import annotations

from tests.airflow_fixtures import KUBECONFIG, LOAD, in_airflow


def test_each_variable_is_read_once_per_parse(airflow_env, tmp_path):
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    env = {**airflow_env, "DPSYNTH_EXECUTOR": "kubernetes", "DPSYNTH_K8S_CONFIG_FILE": str(tmp_path / "kubeconfig")}
    out = in_airflow("""
    import collections, json
    from airflow.sdk import Variable
    reads = collections.Counter()
    def get(key, *args, **kwargs):
        reads[key] += 1
        return None
    Variable.get = staticmethod(get)
    """ + LOAD.replace("    import json\n", "") + """
    print(json.dumps({"reads": reads, "dags": sorted(bag.dags)}))
    """, env)
    assert len(out["dags"]) == 3
    assert out["reads"] and max(out["reads"].values()) == 1, out["reads"]
