"""What the design takes as public is set by the operator, never read off the data (issue #33, items 3–4):
``partition.key`` has no default (the shipped demo configs set the bundled MNIST's key, said to be public), and
``data.num_classes`` is required (max(label) + 1 would change with the only record of the top class)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from dpsynth.config import load_config
from dpsynth.data import read_parquet, write_parquet
from dpsynth.data.assignment import DEMO_KEY
from tests.stages.helpers import TINY, manifest, stage

REPO = Path(__file__).resolve().parents[2]
UNSET_KEY = "partition.key=null"
UNSET_CLASSES = "data.num_classes=null"


def nothing_written(run) -> bool:
    return not (Path(run) / "sensitive" / "partition").exists()


def test_the_partition_key_has_no_default(tmp_path, source, capsys):
    assert load_config(overrides=[]).partition.key is None
    assert stage("partition", tmp_path / "run", source, UNSET_KEY) == 2
    assert "partition.key: not set" in capsys.readouterr().err and nothing_written(tmp_path / "run")


def test_the_shipped_configs_set_the_demos_key_and_say_it_is_public():
    for path in sorted((REPO / "configs").glob("*.yaml")):
        cfg = load_config(path)
        assert cfg.partition.key == DEMO_KEY and cfg.data.num_classes == 10, path.name
        (line,) = [x for x in path.read_text().splitlines() if x.strip().startswith("key:")]
        assert "demo" in line and "PUBLIC" in line, path.name


def without_top_class(mnist600, keep: int):
    """mnist600 with only ``keep`` records of class 9, declaring max(label) + 1 classes as an importer infers."""
    nines = np.flatnonzero(mnist600.labels == 9)
    ds = mnist600.subset(np.setdiff1d(np.arange(len(mnist600)), nines[keep:]))
    return dataclasses.replace(ds, num_classes=int(ds.labels.max()) + 1)


@pytest.mark.parametrize("keep", [1, 0])  # neighbours: the only record of the top class, or not
def test_the_label_set_is_the_configs_not_the_datas(tmp_path, mnist600, keep, capsys):
    path = tmp_path / "source.parquet"
    write_parquet(without_top_class(mnist600, keep), path)
    assert read_parquet(path).num_classes == 10 - (keep == 0)  # what the data alone would say
    assert stage("partition", tmp_path / "unset", str(path), UNSET_CLASSES) == 2
    err = capsys.readouterr().err
    assert "data.num_classes: not set" in err and nothing_written(tmp_path / "unset")
    assert "declares" not in err  # never the data's own count, max(label) + 1: what this test hides (#52 item 3)
    assert stage("partition", tmp_path / "run", str(path)) == 0  # TINY sets data.num_classes=10
    shards = [o for o in manifest(tmp_path / "run", "sensitive", "partition")["outputs"] if o["role"] == "shard"]
    assert {read_parquet(o["uri"]).num_classes for o in shards} == {10}  # G's embedding: 10 classes either way
    from dpsynth.methods.networks import image_spec

    cfg = load_config(overrides=[*TINY, UNSET_CLASSES])
    assert image_spec(cfg, read_parquet(shards[0]["uri"]))["num_classes"] == 10


def test_a_label_outside_the_public_set_is_refused(tmp_path, source, capsys):
    assert stage("partition", tmp_path / "run", source, "data.num_classes=5") == 2
    err = capsys.readouterr().err
    assert "data.num_classes: 5 classes, but a record's label lies outside [0, 4]" in err
    assert nothing_written(tmp_path / "run")
    assert "record_id" not in err and not re.search(r"label [5-9]\b", err)  # no record, no label (#52 item 3)


def test_the_docs_say_what_is_public_and_what_the_settings_were_tuned_on():
    text = " ".join((REPO / "docs" / "privacy.md").read_text().split())
    assert "n and the label set are public" in text
    assert "The dataset's version history is public" in text  # and every statement says it (#52 item 2)
    from dpsynth.privacy.statement import PUBLIC_FACTS

    assert "version history is public" in PUBLIC_FACTS and "What the gate lets out" in text
    assert "A hyperparameter search on the sensitive records is outside the guarantee" in text
    assert "tuned on the bundled MNIST" in text
