import pytest

from dpsynth.methods.discriminator_steps import AdaptiveSteps, FixedSteps, ladder_index, ladder_value


def test_ladder_is_the_papers():
    assert [ladder_value(i) for i in range(11)] == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert ladder_index(50) == 5
    with pytest.raises(ValueError, match="n_d"):
        ladder_index(3)


def reference_schedule(accuracies, *, beta, threshold):
    """The rule of §6.2 written out independently: EMA of every observation, never reset;
    move to the next n_D when the EMA is at or below d and the current value has had its
    grace period of 2/(1-β) generator steps."""
    ladder = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    grace = round(2 / (1 - beta))
    idx, ema, age, out = 0, None, 0, []
    for a in accuracies:
        ema = a if ema is None else beta * ema + (1 - beta) * a
        age += 1
        if age >= grace and ema <= threshold:
            idx, age = idx + 1, 0
        out.append(ladder[idx])
    return out


def test_adaptive_rule_on_a_scripted_sequence():
    # accuracy starts perfect, falls linearly to 0.3 and stays there
    accs = [max(0.3, 1.0 - i / 400) for i in range(2000)]
    sched = AdaptiveSteps(threshold=0.6, beta=0.99)
    seen = []
    for a in accs:
        sched.observe(a)
        seen.append(sched.n_d)
    assert seen == reference_schedule(accs, beta=0.99, threshold=0.6)
    # once the EMA is below d the value moves exactly every 200 generator steps
    changes = [i for i in range(1, len(seen)) if seen[i] != seen[i - 1]]
    assert all(b - a == 200 for a, b in zip(changes[1:], changes[2:]))
    assert seen[-1] > 10


def test_constant_low_accuracy_moves_every_grace_period():
    # EMA is 0.5 <= 0.6 from the first observation; grace 2/(1-0.99) = 200 generator steps.
    sched = AdaptiveSteps(threshold=0.6, beta=0.99)
    seen = []
    for _ in range(601):
        sched.observe(0.5)
        seen.append(sched.n_d)
    assert seen[198] == 1 and seen[199] == 2 and seen[398] == 2 and seen[399] == 5 and seen[599] == 10


def test_high_accuracy_never_moves():
    sched = AdaptiveSteps(threshold=0.6, beta=0.99)
    for _ in range(1000):
        sched.observe(0.9)
    assert sched.n_d == 1 and sched.ema == pytest.approx(0.9)


def test_ema_is_not_reset_and_state_round_trips():
    a = AdaptiveSteps(threshold=0.6, beta=0.9)  # grace 20
    for _ in range(25):
        a.observe(0.1)
    assert a.n_d == 2
    ema_after_move = a.ema
    assert ema_after_move == pytest.approx(0.1)  # not reset by the move
    b = AdaptiveSteps(threshold=0.6, beta=0.9)
    b.load_state_dict(a.state_dict())
    for s in (a, b):
        for _ in range(30):
            s.observe(0.2)
    assert a.state_dict() == b.state_dict()


def test_fixed_steps():
    f = FixedSteps(5)
    f.observe(0.0)
    assert f.n_d == 5
    with pytest.raises(ValueError):
        FixedSteps(0)
