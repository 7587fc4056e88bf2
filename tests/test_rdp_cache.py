"""tests/rdp_cache.py: a session's processes share the RDP curves they compute, as the same floats."""

from opacus.accountants.analysis import rdp as opacus_rdp

from dpsynth.privacy import accountants
from tests import rdp_cache

ORDERS = (1.5, 2.0, 12.0)


def opacus(q: float, sigma: float) -> list[float]:
    return [opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=[o])[0] for o in (1.5, 2, 12)]


def test_a_curve_is_computed_once_then_read_back_as_the_same_floats(tmp_path, monkeypatch):
    monkeypatch.setenv(rdp_cache.VAR, str(tmp_path))
    calls = []
    real = opacus_rdp.compute_rdp
    monkeypatch.setattr(opacus_rdp, "compute_rdp", lambda **k: calls.append(k) or real(**k))
    first = accountants._rdp_per_step(0.0123, 1.37, ORDERS)
    assert len(calls) == 3 and len(list(tmp_path.glob("*.f64"))) == 1
    accountants._rdp_per_step.cache_clear()  # as another process: only the store has it
    again = accountants._rdp_per_step(0.0123, 1.37, ORDERS)
    assert len(calls) == 3  # read, not computed
    assert again.tobytes() == first.tobytes() and not again.flags.writeable
    assert list(again) == opacus(0.0123, 1.37)  # Opacus' own floats, order by order


def test_without_the_variable_a_process_computes_its_own(monkeypatch):
    """A fresh interpreter a test starts (a torchrun rank) has no store: Opacus computes, as in production."""
    monkeypatch.delenv(rdp_cache.VAR, raising=False)
    calls = []
    real = opacus_rdp.compute_rdp
    monkeypatch.setattr(opacus_rdp, "compute_rdp", lambda **k: calls.append(k) or real(**k))
    got = accountants._rdp_per_step(0.0321, 1.73, ORDERS)
    assert len(calls) == 3 and list(got) == opacus(0.0321, 1.73)
