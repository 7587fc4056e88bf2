"""tests/rdp_cache.py: a session's processes share the RDP curves they compute, as the same floats."""

import pytest
from opacus.accountants.analysis import rdp as opacus_rdp

from dpsynth.privacy import accountants
from tests import rdp_cache

ORDERS = (1.5, 2.0, 12.0)


def opacus(q: float, sigma: float) -> list[float]:
    """Opacus' own RDP of one step at each of ORDERS (an integer order passed as an int, as the accountant does)."""
    return [opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=[int(a) if a.is_integer() else a])[0]
            for a in ORDERS]


@pytest.fixture
def computed(monkeypatch) -> list:
    """The calls the accountant makes of Opacus' compute_rdp."""
    calls = []
    real = opacus_rdp.compute_rdp
    monkeypatch.setattr(opacus_rdp, "compute_rdp", lambda **k: calls.append(k) or real(**k))
    return calls


def test_a_curve_is_computed_once_then_read_back_as_the_same_floats(tmp_path, monkeypatch, computed):
    monkeypatch.setenv(rdp_cache.VAR, str(tmp_path))
    first = accountants._rdp_per_step(0.0123, 1.37, ORDERS)
    assert len(computed) == 3 and len(list(tmp_path.glob("*.f64"))) == 1
    accountants._rdp_per_step.cache_clear()  # as another process: only the store has it
    again = accountants._rdp_per_step(0.0123, 1.37, ORDERS)
    assert len(computed) == 3  # read, not computed
    assert again.tobytes() == first.tobytes() and not again.flags.writeable
    assert list(again) == opacus(0.0123, 1.37)  # Opacus' own floats, order by order


def test_without_the_variable_a_process_computes_its_own(monkeypatch, computed):
    """A fresh interpreter a test starts (a torchrun rank) has no store: Opacus computes, as in production."""
    monkeypatch.delenv(rdp_cache.VAR, raising=False)
    got = accountants._rdp_per_step(0.0321, 1.73, ORDERS)
    assert len(computed) == 3 and list(got) == opacus(0.0321, 1.73)
