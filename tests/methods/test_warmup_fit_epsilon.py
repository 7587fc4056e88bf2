"""warmup.fit_epsilon: the releases that do not fit privacy.epsilon are left out, the last in the trace first, and
every reader of the configuration (trainer, audit, statement) sees the same releases."""

import pytest
import yaml
from opacus.accountants import RDPAccountant

from dpsynth.config import REPO_ROOT, dump_config, load_config
from dpsynth.errors import PrivacyError
from dpsynth.mechanisms import warmup_releases

GENERIC = REPO_ROOT / "configs" / "dpgan-generic-cpu.yaml"
SIGMAS = {"intensity_histogram": 20.0, "class_means": 5.0, "polarity_shapes": 3.0, "variations": 0.6}  # the YAML's


def opacus_epsilon(names: list[str], delta: float = 1e-5) -> float:
    """An independent account (Opacus' RDP accountant) of full-batch Gaussian releases with the YAML's σ."""
    ref = RDPAccountant()
    ref.history = [(SIGMAS[name], 1.0, 1) for name in names]
    return ref.get_epsilon(delta)


@pytest.mark.parametrize("epsilon, kept", [
    (10.0, ["intensity_histogram", "class_means", "polarity_shapes", "variations"]),
    (5.0, ["intensity_histogram", "class_means", "polarity_shapes"]),
    (1.0, ["intensity_histogram", "class_means"]),
])
def test_the_generic_recipe_leaves_out_what_does_not_fit(epsilon, kept):
    cfg = load_config(GENERIC, overrides=[f"privacy.epsilon={epsilon}"])
    assert warmup_releases.release_names(cfg) == kept
    assert opacus_epsilon(kept) < epsilon  # what is kept fits, by a second library's account
    every = list(SIGMAS)
    if len(kept) < len(every):  # and the first release left out would not have
        assert opacus_epsilon(every[:len(kept) + 1]) >= epsilon
    assert (cfg.warmup.variations == 0) == ("variations" not in kept)
    assert (cfg.warmup.polarity_noise_multiplier is None) == ("polarity_shapes" not in kept)
    warmup_releases.prefix(cfg, accountant="rdp")  # not refused


def test_the_stored_configuration_says_what_was_left_out_and_reloads_the_same(tmp_path):
    cfg = load_config(GENERIC, overrides=["privacy.epsilon=1"])
    stored = tmp_path / "config.yaml"
    stored.write_text(dump_config(cfg))
    warmup = yaml.safe_load(stored.read_text())["warmup"]
    assert warmup["variations"] == 0 and warmup["polarity_noise_multiplier"] is None
    assert load_config(stored) == cfg


def test_without_it_a_configuration_that_does_not_fit_is_refused_naming_the_setting():
    cfg = load_config(GENERIC, overrides=["privacy.epsilon=1", "warmup.fit_epsilon=false"])
    assert cfg.warmup.variations == 8  # nothing left out
    with pytest.raises(PrivacyError, match="warmup.fit_epsilon=true"):
        warmup_releases.prefix(cfg, accountant="rdp")


def test_class_means_that_alone_do_not_fit_are_still_refused():
    cfg = load_config(GENERIC, overrides=["privacy.epsilon=0.1"])
    assert warmup_releases.release_names(cfg) == ["intensity_histogram", "class_means"]
    with pytest.raises(PrivacyError, match="privacy.epsilon: 0.1 is spent by the warm-up's releases alone"):
        warmup_releases.prefix(cfg, accountant="rdp")
