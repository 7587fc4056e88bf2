"""Threads from the CPUs the process really has (#55 item 12): cgroup v2/v1 quotas from fake cgroup files,
affinity, the overrides, and the count reaching torch in a real ``dpsynth`` process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpsynth import threads
from dpsynth.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def _v2(tmp_path: Path, own: str, limits: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for relative, text in limits.items():
        directory = root / relative
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cpu.max").write_text(text + "\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text(f"0::{own}\n")
    return root, proc


def test_cgroup_v2_quota_of_the_process_and_its_ancestors(tmp_path):
    root, proc = _v2(tmp_path, "/kubepods/pod1/c1", {"": "max 100000", "kubepods/pod1": "250000 100000",
                                                     "kubepods/pod1/c1": "max 100000"})
    assert threads.cgroup_cpu_limit(root, proc) == 2.5  # the pod's limit, set one level up
    root, proc = _v2(tmp_path / "b", "/", {"": "150000 100000"})  # a container's namespace: its cgroup is /
    assert threads.cgroup_cpu_limit(root, proc) == 1.5
    root, proc = _v2(tmp_path / "c", "/", {"": "max 100000"})
    assert threads.cgroup_cpu_limit(root, proc) is None


def test_cgroup_v1_quota(tmp_path):
    root = tmp_path / "cgroup"
    (root / "cpu,cpuacct").mkdir(parents=True)
    (root / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("400000\n")
    (root / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("4:memory:/\n3:cpu,cpuacct:/\n0::/\n")
    assert threads.cgroup_cpu_limit(root, proc) == 4.0
    (root / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cgroup_cpu_limit(root, proc) is None
    assert threads.cgroup_cpu_limit(tmp_path / "absent", tmp_path / "absent-too") is None


def test_choose_takes_the_smaller_of_quota_rounded_up_and_affinity(tmp_path, monkeypatch):
    for var in (threads.OVERRIDE_VAR, "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 64)
    root, proc = _v2(tmp_path, "/", {"": "150000 100000"})
    count, why = threads.choose(root, proc)
    assert count == 2 and "quota 1.5" in why and "64 CPUs" in why
    root, proc = _v2(tmp_path / "b", "/", {"": "50000 100000"})  # 500m: still one thread
    assert threads.choose(root, proc)[0] == 1
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 3)  # taskset / cpuset narrower than the quota
    root, proc = _v2(tmp_path / "c", "/", {"": "800000 100000"})
    assert threads.choose(root, proc)[0] == 3
    root, proc = _v2(tmp_path / "d", "/", {"": "max 100000"})
    assert threads.choose(root, proc) == (3, "3 CPUs in this process's affinity, no cgroup CPU quota")


def test_overrides(tmp_path, monkeypatch):
    root, proc = _v2(tmp_path, "/", {"": "150000 100000"})
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.choose(root, proc) == (1, "OMP_NUM_THREADS=1")
    monkeypatch.setenv(threads.OVERRIDE_VAR, "6")
    assert threads.choose(root, proc) == (6, "DPSYNTH_THREADS=6")
    monkeypatch.setenv(threads.OVERRIDE_VAR, "zero")
    with pytest.raises(ConfigError, match="DPSYNTH_THREADS: expected a whole number"):
        threads.choose(root, proc)


def test_a_dpsynth_command_logs_and_applies_its_count():
    """A real process: the count reaches torch and the BLAS variables, and is logged once at start."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(DPSYNTH_THREADS="3", PYTHONPATH=str(REPO / "components"))
    code = ("import os, sys, torch; from dpsynth.cli import main; "
            "main(['data', 'info', '/nonexistent.parquet']); "
            "print(torch.get_num_threads(), os.environ['OMP_NUM_THREADS'], os.environ['MKL_NUM_THREADS'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["3", "3", "3"], done.stderr
    assert done.stderr.count("threads: 3 (DPSYNTH_THREADS=3; DPSYNTH_THREADS overrides)") == 1


def test_ranks_on_this_machine_share_its_threads(monkeypatch):
    """torchrun's ranks started by dpsynth (the local federated job, --launch torchrun) divide the count: K + 1 ranks
    of the parent's N threads each would be (K + 1) × N threads on N CPUs."""
    monkeypatch.setattr(threads, "_configured", 8)
    env = threads.environment_for(3)
    assert [env[v] for v in (threads.OVERRIDE_VAR, *threads.LIBRARY_VARS)] == ["2"] * 4
    assert threads.environment_for(20)[threads.OVERRIDE_VAR] == "1"
