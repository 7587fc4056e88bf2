"""Mechanism events, folding, and the run-length mechanism trace."""

import json
import math

import pytest

from dpsynth.errors import PrivacyError
from dpsynth.privacy.events import TRACE_FORMAT, MechanismEvent, MechanismTrace, fold_releases


def poisson(q=0.01, sigma=1.0, count=1):
    return MechanismEvent(sampling="poisson", sample_rate=q, noise_multiplier=sigma, sensitivity="add_remove", count=count)


# --- events ---------------------------------------------------------------------------------


def test_event_fields_and_round_trip():
    e = MechanismEvent(sampling="without_replacement", sample_rate=0.001, noise_multiplier=4.0,
                       sensitivity="replace_one", count=20000)
    assert e.to_dict() == {"sampling": "without_replacement", "sample_rate": 0.001, "noise_multiplier": 4.0,
                           "sensitivity": "replace_one", "count": 20000}
    assert MechanismEvent.from_dict(json.loads(json.dumps(e.to_dict()))) == e


def test_event_is_frozen_and_coerces_numbers():
    e = MechanismEvent(sampling="full_batch", sample_rate=1, noise_multiplier=3, sensitivity="add_remove")
    assert isinstance(e.sample_rate, float) and isinstance(e.noise_multiplier, float) and e.count == 1
    with pytest.raises(AttributeError):
        e.count = 2


@pytest.mark.parametrize(
    "field, kwargs",
    [
        ("sampling", dict(sampling="shuffle")),
        ("sensitivity", dict(sensitivity="bounded")),
        ("sample_rate", dict(sample_rate=0.0)),
        ("sample_rate", dict(sample_rate=1.5)),
        ("sample_rate", dict(sample_rate=float("nan"))),
        ("sample_rate", dict(sample_rate="a lot")),
        ("sample_rate", dict(sampling="full_batch", sample_rate=0.5)),
        ("noise_multiplier", dict(noise_multiplier=0.0)),
        ("noise_multiplier", dict(noise_multiplier=-1.0)),
        ("noise_multiplier", dict(noise_multiplier=float("inf"))),
        ("count", dict(count=-1)),
        ("count", dict(count=2.5)),
        ("count", dict(count=True)),
    ],
)
def test_bad_event_names_the_field(field, kwargs):
    args = dict(sampling="poisson", sample_rate=0.01, noise_multiplier=1.0, sensitivity="add_remove") | kwargs
    with pytest.raises(PrivacyError, match=f"^{field}: "):
        MechanismEvent(**args)


def test_event_from_dict_rejects_unknown_and_missing_fields():
    with pytest.raises(PrivacyError, match="unknown field"):
        MechanismEvent.from_dict(poisson().to_dict() | {"clip": 1.0})
    data = poisson().to_dict()
    del data["noise_multiplier"]
    with pytest.raises(PrivacyError, match="noise_multiplier"):
        MechanismEvent.from_dict(data)


# --- folding ----------------------------------------------------------------------------------


def test_fold_releases_is_sigma_over_sqrt_n():
    assert fold_releases(4.0, 16) == pytest.approx(1.0)
    assert fold_releases(1.07, 1) == 1.07
    # GS-WGAN's published setting (DESIGN.md): σ = 1.07 per release, B = 32 releases per step.
    assert fold_releases(1.07, 32) == pytest.approx(1.07 / math.sqrt(32))


def test_fold_matches_renyi_additivity():
    # n Gaussian releases of sensitivity 1 each have RDP α/(2σ²); composed, n·α/(2σ²),
    # which is the RDP of one Gaussian with σ/√n (Mironov 2017, Prop. 7 and Prop. 1).
    sigma, n, alpha = 2.5, 7, 13.0
    assert n * alpha / (2 * sigma**2) == pytest.approx(alpha / (2 * fold_releases(sigma, n) ** 2))


@pytest.mark.parametrize("sigma, n, field", [(0.0, 2, "noise_multiplier"), (1.0, 0, "n_releases"),
                                             (1.0, 1.5, "n_releases"), (-2.0, 3, "noise_multiplier")])
def test_fold_rejects_bad_input(sigma, n, field):
    with pytest.raises(PrivacyError, match=f"^{field}: "):
        fold_releases(sigma, n)


# --- trace ------------------------------------------------------------------------------------


def test_record_merges_runs_of_the_same_mechanism():
    a, b = poisson(sigma=1.0), poisson(sigma=2.0)
    trace = MechanismTrace()
    for _ in range(3):
        trace.record(a)
    trace.record(b, count=2)
    trace.record(a)
    assert [(e.noise_multiplier, e.count) for e in trace.events] == [(1.0, 3), (2.0, 2), (1.0, 1)]
    assert trace.steps == 6 and len(trace) == 3


def test_record_multiplies_event_count_and_skips_zero():
    trace = MechanismTrace()
    trace.record(poisson(count=5), count=2)
    trace.record(poisson(), count=0)
    assert trace.steps == 10 and len(trace) == 1
    with pytest.raises(PrivacyError, match="^count: "):
        trace.record(poisson(), count=-1)
    with pytest.raises(PrivacyError, match="^event: "):
        trace.record({"sampling": "poisson"})


def test_merging_compares_every_field_but_count():
    trace = MechanismTrace([poisson(q=0.01), poisson(q=0.02), poisson(q=0.02, count=3)])
    assert [e.count for e in trace.events] == [1, 4]
    wor = MechanismEvent(sampling="without_replacement", sample_rate=0.02, noise_multiplier=1.0,
                         sensitivity="add_remove")
    trace.record(wor)
    assert len(trace) == 3


def test_trace_equality_and_events_are_immutable_views():
    t1 = MechanismTrace([poisson(count=2)])
    t2 = MechanismTrace([poisson(), poisson()])
    assert t1 == t2 and t1 != MechanismTrace([poisson(count=3)])
    assert isinstance(t1.events, tuple)
    copy = t1.copy()
    copy.record(poisson())
    assert t1.steps == 2 and copy.steps == 3


def test_json_round_trip_with_format_key():
    trace = MechanismTrace([poisson(q=128 / 60000, count=450000), poisson(q=1 / 118, sigma=2.0, count=7)])
    data = json.loads(trace.to_json())
    assert data["format"] == TRACE_FORMAT == "dpsynth.mechanism_trace/1"
    assert data["steps"] == 450007
    assert MechanismTrace.from_json(trace.to_json()) == trace
    assert MechanismTrace.from_dict(trace.to_dict()) == trace
    back = MechanismTrace.from_json(trace.to_json())
    assert back.events[0].sample_rate == 128 / 60000  # floats survive JSON exactly


def test_state_dict_round_trip():
    trace = MechanismTrace([poisson(count=3), poisson(sigma=3.0)])
    restored = MechanismTrace([poisson(sigma=9.0)])
    restored.load_state_dict(trace.state_dict())
    assert restored == trace


@pytest.mark.parametrize(
    "data, field",
    [
        ({"events": []}, "format"),
        ({"format": "dpsynth.mechanism_trace/0", "events": []}, "format"),
        ({"format": TRACE_FORMAT, "events": {}}, "events"),
        ({"format": TRACE_FORMAT, "steps": 5, "events": [poisson(count=4).to_dict()]}, "steps"),
        ({"format": TRACE_FORMAT, "events": [poisson().to_dict() | {"sample_rate": 2.0}]}, "sample_rate"),
    ],
)
def test_from_dict_rejects_bad_traces(data, field):
    with pytest.raises(PrivacyError, match=f"^{field}: "):
        MechanismTrace.from_dict(data)


def test_from_json_rejects_invalid_json():
    with pytest.raises(PrivacyError, match="^trace: "):
        MechanismTrace.from_json("{not json")


def test_docstring_examples_run():
    import doctest

    import dpsynth.privacy.events as module

    assert doctest.testmod(module, raise_on_error=False).failed == 0
