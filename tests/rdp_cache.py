"""One store of the RDP accountant's per-step curves for every process of a test session.

``dpsynth.privacy.accountants._rdp_per_step`` (Opacus' RDP of one sampled-Gaussian step at each order) is cached per
process. A session's processes compute the same curves again: the ranks of one job calibrate the same σ at the same
time, and the tests' tiny configurations recur across modules. Of the quick tier's 54 CPU-s of curves, 20 were
computed by a process when another had already computed them (1,122 curves, 902 of them distinct: measured by
logging every process's cache misses).

Here a process that needs a curve takes it from ``$DPSYNTH_TEST_RDP_STORE`` (a directory the session's first process
makes), or computes it with the same function and leaves it there: the same floats, written and read as float64
bytes. One lock file per curve: a process that wants a curve another is computing waits for it. Without the variable
(a process a test starts afresh: torchrun's ranks, a stage's subprocess) nothing changes.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
from pathlib import Path

import numpy as np

VAR = "DPSYNTH_TEST_RDP_STORE"


def install() -> None:
    """Route ``_rdp_per_step`` through the session's store (once per process)."""
    from dpsynth.privacy import accountants

    computed = accountants._rdp_per_step
    if getattr(computed, "session_store", False):
        return

    @functools.lru_cache(maxsize=4096)
    def stored(q: float, sigma: float, orders: tuple[float, ...]) -> np.ndarray:
        directory = os.environ.get(VAR)
        if not directory:
            return computed(q, sigma, orders)
        key = hashlib.sha256(repr((float(q).hex(), float(sigma).hex(), [float(a).hex() for a in orders])).encode())
        path = Path(directory) / f"{key.hexdigest()}.f64"
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if path.exists():
                values = np.fromfile(path, dtype=np.float64)
                values.setflags(write=False)
                return values
            values = computed(q, sigma, orders)
            part = path.with_suffix(f".{os.getpid()}.part")
            values.astype(np.float64).tofile(part)
            os.replace(part, path)
            return values

    stored.session_store = True
    accountants._rdp_per_step = stored
