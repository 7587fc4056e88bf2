"""#52 finding 7: MLflow's object-store key cannot read the sensitive zone.

The MLflow pod reads its key from its own Secret (``mlflow.s3Secret``), never the stage pods' (which read and write
the run root, its sensitive zone included); the bundled MinIO's buckets Job makes that key a user with the chart's
policy (``files/mlflow-s3-policy.json``, rendered into ConfigMap ``<release>-minio-policies``). Here the rendered
policy is enforced by moto's IAM (authorization on, ``set_initial_no_auth_action_count``): a user with it writes and
reads MLflow's bucket and is refused the run root's bucket; a user allowed everything (the control) reads it.
"""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.deploy.test_chart import CREDENTIALS, find, render, tools

SETUP_ACTIONS = 11  # the calls made as the unauthenticated root below, before the users' own


def rendered_policy() -> dict:
    cm = find(render(*CREDENTIALS), "ConfigMap", "-minio-policies")
    return json.loads(cm["data"]["mlflow-s3-policy.json"])


@tools
def test_the_mlflow_key_is_refused_the_run_roots_bucket(monkeypatch):
    moto = pytest.importorskip("moto")
    from moto.core import set_initial_no_auth_action_count

    policy = rendered_policy()
    docs = render(*CREDENTIALS)
    [mlflow] = find(docs, "Deployment", "-mlflow")["spec"]["template"]["spec"]["containers"]
    keys = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in mlflow["env"] if e["name"].startswith("AWS_")}
    assert set(keys.values()) == {"dpsynth-mlflow-s3"}  # not the stage Secret
    stage_bucket = "dpsynth"  # pipeline.runRoot's (REQUIRED: s3://dpsynth/runs)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3",
              "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")

    @set_initial_no_auth_action_count(SETUP_ACTIONS)
    @moto.mock_aws
    def check():
        root_s3, iam = boto3.client("s3"), boto3.client("iam")
        root_s3.create_bucket(Bucket="mlflow")
        root_s3.create_bucket(Bucket=stage_bucket)
        root_s3.put_object(Bucket=stage_bucket, Key="runs/r1/sensitive/data/.version-key", Body=b"k")
        made = {}
        for user, document in (("mlflow", policy), ("everything", {"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]})):
            iam.create_user(UserName=user)
            arn = iam.create_policy(PolicyName=user, PolicyDocument=json.dumps(document))["Policy"]["Arn"]
            iam.attach_user_policy(UserName=user, PolicyArn=arn)
            key = iam.create_access_key(UserName=user)["AccessKey"]
            made[user] = boto3.client("s3", aws_access_key_id=key["AccessKeyId"],
                                      aws_secret_access_key=key["SecretAccessKey"])
        s3 = made["mlflow"]
        s3.put_object(Bucket="mlflow", Key="1/abc/artifacts/card.html", Body=b"<html/>")
        assert s3.get_object(Bucket="mlflow", Key="1/abc/artifacts/card.html")["Body"].read() == b"<html/>"
        for call in (lambda: s3.get_object(Bucket=stage_bucket, Key="runs/r1/sensitive/data/.version-key"),
                     lambda: s3.list_objects_v2(Bucket=stage_bucket),
                     lambda: s3.put_object(Bucket=stage_bucket, Key="runs/x", Body=b"x")):
            with pytest.raises(ClientError, match="AccessDenied"):
                call()
        # the control: enforcement is on, and a key allowed everything does read it
        control = made["everything"].get_object(Bucket=stage_bucket, Key="runs/r1/sensitive/data/.version-key")
        assert control["Body"].read() == b"k"

    check()


@tools
def test_the_policy_names_only_the_artifact_roots_bucket():
    policy = rendered_policy()
    resources = {r for s in policy["Statement"] for r in s["Resource"]}
    assert resources == {"arn:aws:s3:::mlflow", "arn:aws:s3:::mlflow/*"}
    other = json.loads(find(render(*CREDENTIALS, "--set", "mlflow.artifactRoot=s3://tracking/prefix/"), "ConfigMap",
                            "-minio-policies")["data"]["mlflow-s3-policy.json"])
    assert {r for s in other["Statement"] for r in s["Resource"]} == {"arn:aws:s3:::tracking", "arn:aws:s3:::tracking/*"}
