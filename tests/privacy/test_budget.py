"""The budget guard stops training before the step that would exceed ε; δ < 1/n."""

import math

import pytest

from dpsynth.errors import PrivacyError
from dpsynth.privacy import BudgetGuard, MechanismEvent, MechanismTrace, check_delta, epsilon


def poisson(q=0.01, sigma=1.0, count=1):
    return MechanismEvent(sampling="poisson", sample_rate=q, noise_multiplier=sigma, sensitivity="add_remove", count=count)


GAUSSIAN = MechanismEvent(sampling="full_batch", sample_rate=1.0, noise_multiplier=10.0, sensitivity="add_remove")


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_training_loop_stops_before_the_step_that_would_exceed(accountant):
    guard = BudgetGuard(target_epsilon=3.0, delta=1e-5, accountant=accountant, event=GAUSSIAN)
    trace = MechanismTrace()
    while guard.can_step(trace):
        trace.record(GAUSSIAN)
    assert trace.steps == guard.max_steps > 0
    assert guard.spent(trace) <= 3.0
    one_more = trace.copy()
    one_more.record(GAUSSIAN)
    assert epsilon(one_more, delta=1e-5, accountant=accountant) > 3.0
    assert guard.remaining(trace) == 0 and not guard.can_step(trace)


def test_can_step_counts_ahead():
    guard = BudgetGuard(target_epsilon=1.0, delta=1e-5, event=poisson(q=0.01, sigma=2.0))
    trace = MechanismTrace([poisson(q=0.01, sigma=2.0, count=guard.max_steps - 5)])
    assert guard.remaining(trace) == 5
    assert guard.can_step(trace, 5) and not guard.can_step(trace, 6)
    assert guard.can_step(trace, 0)
    with pytest.raises(PrivacyError, match="^n: "):
        guard.can_step(trace, -1)


def test_event_count_is_ignored():
    a = BudgetGuard(target_epsilon=3.0, delta=1e-5, event=GAUSSIAN.with_count(100))
    b = BudgetGuard(target_epsilon=3.0, delta=1e-5, event=GAUSSIAN)
    assert a.max_steps == b.max_steps and a.event.count == 1


def test_a_trace_with_other_events_is_accounted_in_full():
    event = poisson(q=0.01, sigma=1.2)
    guard = BudgetGuard(target_epsilon=5.0, delta=1e-5, event=event)
    trace = MechanismTrace([poisson(q=0.05, sigma=1.5, count=300)])  # e.g. an earlier phase
    n = guard.remaining(trace)
    assert 0 < n < guard.max_steps
    trace.record(event, count=n)
    assert guard.spent(trace) <= 5.0 and not guard.can_step(trace)
    trace.record(event)
    assert guard.spent(trace) > 5.0


def test_an_exhausted_trace_has_nothing_remaining():
    guard = BudgetGuard(target_epsilon=1.0, delta=1e-5, event=poisson())
    assert guard.remaining(MechanismTrace([poisson(count=10 * guard.max_steps)])) == 0
    assert guard.remaining(MechanismTrace([poisson(sigma=0.5, count=100_000)])) == 0


def test_state_dict_round_trip():
    guard = BudgetGuard(target_epsilon=3.0, delta=1e-5, event=GAUSSIAN)
    state = guard.state_dict()
    assert state["accountant"] == "rdp" and state["max_steps"] == guard.max_steps
    resumed = BudgetGuard(target_epsilon=3.0, delta=1e-5, event=GAUSSIAN)
    resumed.load_state_dict(state)
    assert resumed.max_steps == guard.max_steps


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(target_epsilon=4.0), "target_epsilon"),
        (dict(delta=1e-6), "delta"),
        (dict(accountant="prv"), "accountant"),
        (dict(event=GAUSSIAN.with_noise(9.0).to_dict()), "event"),
    ],
)
def test_state_from_another_budget_is_refused(change, field):
    state = BudgetGuard(target_epsilon=3.0, delta=1e-5, event=GAUSSIAN).state_dict() | change
    with pytest.raises(PrivacyError, match=f"^{field}: "):
        BudgetGuard(target_epsilon=3.0, delta=1e-5, event=GAUSSIAN).load_state_dict(state)


def test_a_tampered_checkpoint_cannot_widen_the_budget():
    guard = BudgetGuard(target_epsilon=3.0, delta=1e-5, event=GAUSSIAN)
    state = guard.state_dict() | {"max_steps": guard.max_steps + 1}
    with pytest.raises(PrivacyError, match="^max_steps: "):
        BudgetGuard(target_epsilon=3.0, delta=1e-5, event=GAUSSIAN).load_state_dict(state)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(target_epsilon=0.0), "target_epsilon"),
        (dict(delta=1.5), "delta"),
        (dict(accountant="moments"), "accountant"),
        (dict(event=MechanismEvent(sampling="without_replacement", sample_rate=0.001, noise_multiplier=1.0,
                                   sensitivity="replace_one")), "sampling"),
        (dict(event="poisson"), "event"),
    ],
)
def test_guard_rejects_bad_input(kwargs, field):
    args = dict(target_epsilon=1.0, delta=1e-5, event=poisson()) | kwargs
    with pytest.raises(PrivacyError, match=f"^{field}: "):
        BudgetGuard(**args)


def test_check_delta():
    assert check_delta(1e-5, 60_000) == 1e-5
    with pytest.raises(PrivacyError, match=r"^delta: must be < 1/n = 1e-05"):
        check_delta(1e-5, 100_000)
    with pytest.raises(PrivacyError, match=r"^delta: must be < 1/n"):
        check_delta(0.01, 200)
    with pytest.raises(PrivacyError, match=r"^delta: must be in \(0, 1\), got 1.5"):
        check_delta(1.5, 10)
    with pytest.raises(PrivacyError, match="^n: "):
        check_delta(1e-5, 0)
    assert math.isclose(check_delta(0.999e-5, 100_000), 0.999e-5)


def test_docstring_examples_run():
    import doctest

    import dpsynth.privacy.budget as module

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
