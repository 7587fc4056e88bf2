"""How many threads torch and the BLAS/OpenMP libraries use: the CPUs this process really has.

torch's default is one thread per CPU the *machine* has. In a container with a CPU limit (a pod with
``limits.cpu: 2`` on a 64-core node) that is 64 threads sharing two CPUs' worth of time, and the fit
slows to a crawl (issue #55 measured a warm-up fit falling from 11.5 to 1.3 steps/s with two threads beside
another job on two cores; one thread ran at 13 steps/s). So every ``dpsynth`` command that computes starts with
:func:`configure`, which takes the smallest of:

- the CPUs the process may run on (``os.sched_getaffinity``: cpusets, ``taskset``);
- the cgroup's CPU quota, rounded up (v2 ``cpu.max``, on the process's own cgroup and each one above it;
  v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``); no quota means no limit.

``DPSYNTH_THREADS`` overrides the count; so does ``OMP_NUM_THREADS`` when set. Ranks that ``dpsynth`` starts
under ``torchrun`` on this machine share its count (:func:`environment_for`). The count goes to torch
(``torch.set_num_threads``) and to ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` for
libraries and child processes yet to start, and the choice is logged once, with its reason.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

OVERRIDE_VAR = "DPSYNTH_THREADS"
LIBRARY_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")

log = logging.getLogger(__name__)
_configured: int | None = None


def _quota_v2(text: str) -> float | None:
    """``cpu.max`` is ``"QUOTA PERIOD"`` or ``"max PERIOD"``: CPUs' worth of time, or None for no limit."""
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    period = int(fields[1]) if len(fields) > 1 else 100_000
    return int(fields[0]) / period if period > 0 else None


def _quota_v1(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def _own_cgroups(proc_cgroup: Path) -> dict[str, str]:
    """``/proc/self/cgroup``: controller (``""`` for v2's unified line) → the process's cgroup path."""
    paths: dict[str, str] = {}
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(","):
                paths[controller] = parts[2]
    return paths


def _up_from(root: Path, relative: str) -> list[Path]:
    """``root/a/b``, ``root/a``, ``root``: a limit set on any ancestor cgroup applies too."""
    here = root / relative.strip("/") if relative.strip("/") else root
    chain = [here]
    while here != root and root in here.parents:
        here = here.parent
        chain.append(here)
    return chain


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (``1.5`` for ``limits.cpu: 1500m``), or None when
    there is none (or no cgroup filesystem). The smallest over the cgroup and its ancestors, v2 or v1."""
    own = _own_cgroups(proc_cgroup)
    limits = []
    if (root / "cgroup.controllers").exists():  # v2, the unified hierarchy
        for directory in _up_from(root, own.get("", "/")):
            try:
                limits.append(_quota_v2((directory / "cpu.max").read_text()))
            except (OSError, ValueError, IndexError):
                continue
    else:  # v1: the cpu controller's own mount (in a container, the container's cgroup is that mount's root)
        for mount in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            base = root / mount
            if base.is_dir():
                for directory in dict.fromkeys([*_up_from(base, own.get("cpu", "/")), base]):
                    limits.append(_quota_v1(directory))
                break
    limits = [limit for limit in limits if limit is not None]
    return min(limits) if limits else None


def affinity_cpus() -> int:
    """The CPUs this process may be scheduled on (all the machine's where affinity is not supported)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _positive(var: str) -> int | None:
    value = os.environ.get(var, "").strip()
    if not value:
        return None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        from dpsynth.errors import ConfigError

        raise ConfigError(f"{var}: expected a whole number of threads >= 1, got {value!r}")
    return count


def choose(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> tuple[int, str]:
    """``(threads, why)``: the override if set, else the smaller of the CPU affinity and the quota rounded up."""
    for var in (OVERRIDE_VAR, "OMP_NUM_THREADS"):
        count = _positive(var)
        if count is not None:
            return count, f"{var}={count}"
    cpus = affinity_cpus()
    quota = cgroup_cpu_limit(root, proc_cgroup)
    if quota is None:
        return cpus, f"{cpus} CPUs in this process's affinity, no cgroup CPU quota"
    count = max(1, min(cpus, math.ceil(quota - 1e-9)))
    return count, f"cgroup CPU quota {quota:g} CPUs, {cpus} CPUs in this process's affinity"


def configure(*, announce: bool = True) -> int:
    """Set torch's and the BLAS/OpenMP libraries' threads from :func:`choose`; log it (``announce``); the count."""
    global _configured
    count, why = choose()
    for var in LIBRARY_VARS:
        if var == "OMP_NUM_THREADS" or not os.environ.get(var) or os.environ.get(OVERRIDE_VAR):
            os.environ[var] = str(count)
    if "torch" in sys.modules:  # imported already: it read the environment at import
        sys.modules["torch"].set_num_threads(count)
    if announce and count != _configured:
        log.info("threads: %d (%s; %s overrides)", count, why, OVERRIDE_VAR)
    _configured = count
    return count


def count() -> int:
    """The count :func:`configure` chose (choosing it now, quietly, if nothing has)."""
    return _configured if _configured is not None else configure(announce=False)


def environment_for(processes: int) -> dict[str, str]:
    """This process's environment for ``processes`` children that share its CPUs (``torchrun``'s ranks): each gets
    ``count() // processes`` threads (at least 1), through ``DPSYNTH_THREADS`` and the libraries' variables."""
    share = str(max(1, count() // max(1, processes)))
    return {**os.environ, OVERRIDE_VAR: share, **{var: share for var in LIBRARY_VARS}}
