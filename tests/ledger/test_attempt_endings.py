"""However an attempt ends — it finishes, it raises, it is killed — it is charged at least the sound ε of what it
may have run, even an ``as_published`` run that no guard holds to its reservation (issue #33 item 5)."""

import pytest

from dpsynth.methods.gswgan import GSWGANTrainer
from dpsynth.privacy import MechanismTrace, get_accountant
from dpsynth.ledger.attempt import open_attempt
from dpsynth.ledger.charging import charged
from dpsynth.training import loop
from dpsynth.ledger.store import Ledger
from tests.methods.conftest import shards  # noqa: F401 (fixture)
from tests.methods.gswgan_helpers import tiny
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse fixture)

TARGET, DELTA, K_STEPS = 64.0, 1e-4, 3  # as published, 8 iterations fit 64 (63.8); soundly 3 cost 171
AS_PUBLISHED = ("privacy.noise_multiplier=1.07", "privacy.accounting=as_published", f"privacy.epsilon={TARGET}",
                "train.steps=8")


class RaisesAfter(GSWGANTrainer):
    """The real GS-WGAN trainer, which fails after its ``K_STEPS``-th private iteration."""

    def train_step(self):
        super().train_step()
        if self.step == K_STEPS:
            raise RuntimeError(f"failed after iteration {K_STEPS}")


def attempt(ledger, cfg, run="run-1"):
    return open_attempt(ledger, population_id="pop", epsilon=cfg.privacy.epsilon, delta=cfg.privacy.delta,
                        dataset_version="ab" * 32, pipeline_run_id=run, stage="train", records=600,
                        accountant="wor", lineage=None,
                        stale_after_s=None)


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.set_budget("pop", epsilon=1e6, delta=1e-3, reason="test")
    return ledger


def sound(cfg, trainer, steps):
    return get_accountant("wor").epsilon(MechanismTrace([trainer.plan.event.with_count(steps)]), delta=DELTA)


def test_an_as_published_attempt_that_raises_is_charged_the_sound_epsilon_of_its_trace(tmp_path, shards, ledger):
    cfg = tiny(tmp_path / "run", *AS_PUBLISHED)
    with pytest.raises(RuntimeError, match="failed after iteration"):
        with charged(attempt(ledger, cfg)) as charge:
            charge.result = loop.train(charge.admit(RaisesAfter(cfg, shards)))
    (row,) = ledger.history("pop")
    expected = sound(cfg, charge.trainer, K_STEPS)
    assert charge.trainer.trace.steps == K_STEPS and expected > 2 * TARGET  # far beyond its reservation
    assert row["status"] == "committed" and row["epsilon_spent"] == pytest.approx(expected, rel=1e-9)
    assert "OVERDRAW" in row["note"]


def test_a_killed_as_published_attempt_is_charged_the_sound_epsilon_of_its_whole_plan(tmp_path, shards, ledger):
    cfg = tiny(tmp_path / "run", *AS_PUBLISHED)
    killed = attempt(ledger, cfg)
    trainer = GSWGANTrainer(cfg, shards)
    killed.limit(trainer)  # what charge.admit does before the first private step; then the process dies
    whole = sound(cfg, trainer, trainer.plan.steps)
    assert trainer.plan.steps == 8 and whole > 6 * TARGET
    assert ledger.balance("pop")["reserved"] == pytest.approx(whole)  # counted so while it is open
    attempt(ledger, cfg)  # the next attempt of the stage in the same pipeline run settles it as stale
    first, second = ledger.history("pop")
    assert first["status"] == "committed" and first["epsilon_spent"] == pytest.approx(whole)
    assert "stale" in first["note"] and "OVERDRAW" in first["note"]
    # and the dpsynth ledger settle path charges the same
    ledger.settle(second["id"], reason="operator: the process is gone")
    assert ledger.reservation(second["id"])["epsilon_spent"] == pytest.approx(TARGET)  # never limited: its ε
    assert ledger.balance("pop")["committed"] == pytest.approx(whole + TARGET)


def test_a_sound_attempt_records_no_bound(tmp_path, shards, ledger):
    cfg = tiny(tmp_path / "run", "privacy.noise_multiplier=8.0", "privacy.epsilon=50")
    a = attempt(ledger, cfg)
    a.limit(GSWGANTrainer(cfg, shards))
    (row,) = ledger.history("pop")
    assert a.bound == 0.0 and row["epsilon_bound"] is None


def test_a_resumed_attempt_trains_only_on_the_checkpoint_it_adopted(tmp_path, shards, ledger, monkeypatch):
    """The ledger adds a resumed attempt's steps to its adopted checkpoint's (the lineage the checkpoint file
    records), so the trainer must have restored that checkpoint: one that did not is refused before its first
    step, naming both step counts; one that did trains on to its last step."""
    from dpsynth.errors import PrivacyError
    from dpsynth.training import checkpoint

    cfg = tiny(tmp_path / "run", "privacy.noise_multiplier=8.0", "output.checkpoint_every=2", "train.steps=4")
    killed = attempt(ledger, cfg)
    with checkpoint.charging(killed):
        assert GSWGANTrainer(cfg, shards).train(stop_after=2) is None  # its checkpoint at step 2, then "killed"
    killed.charge_in_full("killed")
    lineage = checkpoint.lineage(tmp_path / "run" / "checkpoints")

    def resume(trainer):
        resumed = open_attempt(ledger, population_id="pop", epsilon=cfg.privacy.epsilon, delta=cfg.privacy.delta,
                               dataset_version="ab" * 32, pipeline_run_id="run-1", stage="train", records=600,
                               accountant="wor", lineage=lineage, stale_after_s=None)
        assert resumed.resumes_id == killed.reservation_id and resumed.prefix.steps == 2
        with checkpoint.charging(resumed):
            return trainer.train()

    not_restoring = GSWGANTrainer(cfg, shards)
    monkeypatch.setattr(not_restoring, "load_state_dict", lambda state: None)
    with pytest.raises(PrivacyError, match="adopted the 2 private steps .* restored trace holds 0"):
        resume(not_restoring)
    assert not_restoring.step == 0
    assert resume(GSWGANTrainer(cfg, shards)).steps == 4
