"""#55 item 9: KFP tasks take their inputs as ``Input[...]`` artifacts. Each stage consumes its upstream's output
artifact (partition's Dataset → pre-training and train; the train stage's Model, from whichever train branch ran →
audit and sample; sample's synthetic Dataset → evaluate), as edges of the compiled IR, and the container program
refuses an input that does not name an existing manifest of the upstream stage in this run's directory."""

import json

import pytest
import yaml

from tests.pipelines.test_kfp import YAML, all_tasks
from tests.pipelines.test_kfp_exit import container_argv, on_path, program

# consumer component -> {input name: (artifact type, producer task, producer's output)}
EDGES = {"pretrain-shard": {"partitioned": ("system.Dataset", "dpsynth-partition", "dataset")},
         "pretrain": {"partitioned": ("system.Dataset", "dpsynth-partition", "dataset")},
         "train": {"partitioned": ("system.Dataset", "dpsynth-partition", "dataset")},
         "train-job": {"partitioned": ("system.Dataset", "dpsynth-partition", "dataset")},
         "audit": {"trained": ("system.Model", "condition-branches-", None)},
         "sample": {"trained": ("system.Model", "condition-branches-", None)},
         "evaluate": {"sampled": ("system.Dataset", "dpsynth-sample", "synthetic")}}


@pytest.fixture(scope="module")
def compiled():
    return list(yaml.safe_load_all(YAML.read_text()))[0]


def producer(compiled, task: dict, name: str) -> tuple[str, str]:
    """(producer task, its output) of a task's input artifact; through a ParallelFor's pipeline channel too."""
    spec = task["inputs"]["artifacts"][name]
    if "taskOutputArtifact" in spec:
        return spec["taskOutputArtifact"]["producerTask"], spec["taskOutputArtifact"]["outputArtifactKey"]
    return "(channel)", spec["componentInputArtifact"]


def test_every_stage_consumes_its_upstream_artifact(compiled):
    tasks = all_tasks(compiled)
    for stage, inputs in EDGES.items():
        component = compiled["components"][f"comp-dpsynth-{stage}"]
        declared = component["inputDefinitions"]["artifacts"]
        assert {n: a["artifactType"]["schemaTitle"] for n, a in declared.items()} == {
            n: e[0] for n, e in inputs.items()}, stage
        args = compiled["deploymentSpec"]["executors"][f"exec-dpsynth-{stage}"]["container"]["args"]
        for name, (_, task_name, output) in inputs.items():
            i = args.index("--kfp-input")
            assert args[i:i + 3] == ["--kfp-input", name, f"{{{{$.inputs.artifacts['{name}'].path}}}}"], stage
            got = producer(compiled, tasks[f"dpsynth-{stage}"], name)
            if got[0] == "(channel)":  # inside the loop or a branch: the group's input, which the producer feeds
                assert got[1] == f"pipelinechannel--{task_name}-{output}", (stage, got)
                feeders = [producer(compiled, g, got[1]) for g in tasks.values()
                           if "taskOutputArtifact" in g.get("inputs", {}).get("artifacts", {}).get(got[1], {})]
                assert feeders and set(feeders) == {(task_name, output)}, (stage, feeders)
                got = feeders[0]
            assert got[0] == task_name if output else got[0].startswith(task_name), (stage, got)
            assert output is None or got[1] == output, (stage, got)
            if output is None:
                branches_task = got[0]
    # the OneOf of the two train branches: each branch's model
    branches = compiled["components"][f"comp-{branches_task}"]
    [selector] = branches["dag"]["outputs"]["artifacts"].values()
    sources = {s["producerSubtask"] for s in selector["artifactSelectors"]}
    inner = {t for s in sources for t in compiled["components"][f"comp-{s}"]["dag"]["tasks"]}
    assert inner == {"dpsynth-train", "dpsynth-train-job"}


def artifact(path, run_dir, stage="partition", manifest="manifests/partition.json"):
    path.write_text(json.dumps({"stage": stage, "manifest_uri": f"{run_dir}/{manifest}", "uri": "x"}))
    return ["--kfp-input", "partitioned", str(path)]


def test_the_program_checks_its_input_before_the_stage_runs(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    on_path(tmp_path, monkeypatch, f'echo "$*" >> {calls}\nexit 0\n')
    run = tmp_path / "run"
    (run / "manifests").mkdir(parents=True)
    (run / "manifests" / "partition.json").write_text("{}")
    main = program()["main"]
    art = tmp_path / "partitioned"
    assert main(container_argv(["train"], run, rest=artifact(art, run))) == 0
    assert len(calls.read_text().splitlines()) == 1 and "--kfp-input" not in calls.read_text()
    bad = {"another run's": artifact(art, tmp_path / "other"),
           "another stage's": artifact(art, run, stage="sample"),
           "a missing manifest": artifact(art, run, manifest="manifests/gone.json")}
    for why, rest in bad.items():
        assert main(container_argv(["train"], run, rest=rest)) == 2, why
    (tmp_path / "garbled").write_text("not json")
    assert main(container_argv(["train"], run, rest=["--kfp-input", "partitioned", str(tmp_path / "garbled")])) == 2
    assert len(calls.read_text().splitlines()) == 1  # none of those ran the stage
