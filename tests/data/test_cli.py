import argparse
import json

import numpy as np
import pytest

from dpsynth.data import cli
from dpsynth.errors import DatasetError

from .conftest import MNIST_DIR

MNIST_T10K_CLASS_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture
def run(capsys):
    parser = argparse.ArgumentParser(prog="dpsynth")
    cli.register(parser.add_subparsers(dest="command", required=True))

    def _run(*argv):
        args = parser.parse_args(["data", *map(str, argv)])
        code = args.func(args)
        return code, capsys.readouterr().out

    return _run


def test_import_writes_parquet_and_prints_a_summary(run, mnist, tmp_path):
    dst = tmp_path / "out" / "mnist.parquet"
    code, out = run("import", MNIST_DIR, dst, "--inside")
    assert code == 0 and dst.is_file()
    assert out.count("\n") == 1
    for part in ("10000 rows", "10 classes", "28x28x1", mnist.content_sha256(), str(dst)):
        assert part in out


def test_import_json_summary(run, mnist, tmp_path):
    code, out = run("import", MNIST_DIR, tmp_path / "m.parquet", "--json", "--split", "test", "--inside")
    summary = json.loads(out)
    assert code == 0
    assert summary["rows"] == 10_000 and summary["num_classes"] == 10 and summary["shape"] == [28, 28, 1]
    assert summary["uri"] == str(tmp_path / "m.parquet")
    assert summary["sha256"] != mnist.content_sha256()  # the split is part of the content


def test_import_outside_prints_no_digest_or_count(run, mnist, tmp_path):
    """What an orchestrator logs (#33), and what any log gets unless the data owner asks for ``--inside`` (#52 item
    3): no content sha256 and no record count, in text or JSON."""
    for extra in ((), ("--json",), ("--outside",), ("--outside", "--json")):
        code, out = run("import", MNIST_DIR, tmp_path / "o.parquet", *extra)
        assert code == 0 and (tmp_path / "o.parquet").is_file()
        assert mnist.content_sha256() not in out and "10000" not in out and "10,000" not in out
        assert str(tmp_path / "o.parquet") in out and "28" in out
    assert json.loads(out) == {"uri": str(tmp_path / "o.parquet"), "shape": [28, 28, 1]}


def test_info_reports_counts_splits_and_sha(run, mnist, tmp_path):
    run("import", MNIST_DIR, tmp_path / "m.parquet", "--split", "test", "--num-classes", "10")
    code, out = run("info", tmp_path / "m.parquet", "--json")
    info = json.loads(out)
    assert code == 0
    assert info["rows"] == 10_000 and info["num_classes"] == 10 and info["shape"] == [28, 28, 1]
    assert info["class_counts"] == MNIST_T10K_CLASS_COUNTS
    assert info["splits"] == [{"split": "test", "rows": 10_000}]
    code, text = run("info", tmp_path / "m.parquet")
    assert code == 0
    assert "0:980 1:1135" in text and "test:10000" in text and info["sha256"] in text


def test_failed_import_leaves_no_file(run, tmp_path):
    dst = tmp_path / "d.parquet"
    with pytest.raises(DatasetError, match=r"label: a record's label lies outside the label set \[0, 4\]"):
        run("import", MNIST_DIR, dst, "--num-classes", "5")
    x = np.zeros((3, 2, 2), np.float32)
    x[2, 0, 0] = np.inf
    np.savez(tmp_path / "bad.npz", x=x, y=np.zeros(3, np.int64))
    with pytest.raises(DatasetError, match=r"image: a record has a NaN or infinite pixel"):
        run("import", tmp_path / "bad.npz", dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npz"]


def test_failed_import_keeps_the_previous_file(run, tmp_path):
    dst = tmp_path / "d.parquet"
    np.savez(tmp_path / "good.npz", x=np.zeros((2, 2, 2), np.uint8), y=np.array([0, 1]))
    run("import", tmp_path / "good.npz", dst)
    before = dst.read_bytes()
    np.savez(tmp_path / "bad.npz", x=np.zeros((2, 2, 2), np.uint8), y=np.array([0.0, 0.25]))
    with pytest.raises(DatasetError, match="label"):
        run("import", tmp_path / "bad.npz", dst)
    assert dst.read_bytes() == before


def test_help_describes_the_sources(run, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run("import", "--help")
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "IDX" in text and ".npz" in text and "--num-classes" in text and "atomically" in text


def test_top_level_cli_turns_dataset_errors_into_exit_code_2(tmp_path, capsys):
    pytest.importorskip("dpsynth.privacy.cli")
    pytest.importorskip("dpsynth.runner.train_cli")
    from dpsynth.cli import main

    assert main(["data", "info", str(tmp_path / "absent.parquet")]) == 2
    assert "absent.parquet" in capsys.readouterr().err
