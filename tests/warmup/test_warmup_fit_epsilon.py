"""warmup.fit_epsilon: the releases refitted to privacy.epsilon from the configuration alone, and every reader of the
configuration (trainer, audit, statement) sees the same releases. Checked against Opacus' RDP accountant."""

import pytest
import yaml
from opacus.accountants import RDPAccountant

from dpsynth.config import REPO_ROOT, dump_config, load_config
from dpsynth.errors import PrivacyError
from dpsynth.warmup import releases as warmup_releases

GENERIC = REPO_ROOT / "configs" / "dpgan-generic-cpu.yaml"
YAML_SIGMAS = {"intensity_histogram": 20.0, "class_means": 5.0, "polarity_shapes": 3.0, "variations": 0.6}


def opacus_epsilon(sigmas, delta: float = 1e-5) -> float:
    """An independent account (Opacus' RDP accountant) of full-batch Gaussian releases with these σ."""
    ref = RDPAccountant()
    ref.history = [(sigma, 1.0, 1) for sigma in sigmas]
    return ref.get_epsilon(delta)


def test_releases_that_fit_are_kept_as_configured():
    cfg = load_config(GENERIC)  # ε = 10
    assert dict(cfg.warmup.releases()) == YAML_SIGMAS and not cfg.warmup.variations_shared
    assert opacus_epsilon(YAML_SIGMAS.values()) < 10


@pytest.mark.parametrize("epsilon", [1.0, 2.0, 4.0, 8.0])
def test_below_it_the_releases_get_three_quarters_of_epsilon_and_the_variations_are_shared(epsilon):
    cfg = load_config(GENERIC, overrides=[f"privacy.epsilon={epsilon}"])
    w, made = cfg.warmup, dict(cfg.warmup.releases())
    assert w.variations_shared and w.variations == 8
    spent = opacus_epsilon(made.values())
    assert 0.73 * epsilon < spent <= 0.75 * epsilon * (1 + 1e-6)  # calibrated to 3/4 (rel_tol 1 %), by Opacus
    rho = {name: 1 / (2 * sigma ** 2) for name, sigma in made.items()}
    total = sum(rho.values())
    assert made["intensity_histogram"] == 20.0  # kept
    # the polarity shapes stay only where, with the histogram and the class means as configured, they take ≤ half
    with_polarity = rho["intensity_histogram"] + 1 / (2 * 3.0 ** 2) + 1 / (2 * 5.0 ** 2)
    assert ("polarity_shapes" in made) == (with_polarity <= total / 2 * (1 + 0.03))
    # the class means keep σ = 5 where that is at most half of what is left, else take exactly half
    left = total - rho["intensity_histogram"] - rho.get("polarity_shapes", 0.0)
    assert made["class_means"] == pytest.approx(max(5.0, (2 * left / 2) ** -0.5), rel=1e-9)
    assert rho["variations"] == pytest.approx(left - rho["class_means"], rel=1e-9)
    warmup_releases.prefix(cfg, accountant="rdp")  # not refused


def test_at_epsilon_1_the_polarity_shapes_are_left_out_and_means_and_variations_split_evenly():
    made = dict(load_config(GENERIC, overrides=["privacy.epsilon=1"]).warmup.releases())
    assert list(made) == ["intensity_histogram", "class_means", "variations"]
    assert made["class_means"] == pytest.approx(made["variations"]) and made["class_means"] > 5


def test_the_stored_configuration_says_what_was_chosen_and_reloads_the_same(tmp_path):
    cfg = load_config(GENERIC, overrides=["privacy.epsilon=1"])
    stored = tmp_path / "config.yaml"
    stored.write_text(dump_config(cfg))
    warmup = yaml.safe_load(stored.read_text())["warmup"]
    assert warmup["variations_shared"] is True and warmup["polarity_noise_multiplier"] is None
    assert load_config(stored) == cfg  # resolving it again changes nothing


def test_without_it_a_configuration_that_does_not_fit_is_refused_naming_the_setting():
    cfg = load_config(GENERIC, overrides=["privacy.epsilon=1", "warmup.fit_epsilon=false"])
    assert cfg.warmup.variations_noise_multiplier == 0.6 and not cfg.warmup.variations_shared
    with pytest.raises(PrivacyError, match="warmup.fit_epsilon=true"):
        warmup_releases.prefix(cfg, accountant="rdp")


def test_without_variations_releases_are_left_out_the_last_first():
    cfg = load_config(GENERIC, overrides=["privacy.epsilon=1", "warmup.variations=0"])
    assert warmup_releases.release_names(cfg) == ["intensity_histogram", "class_means"]
    assert opacus_epsilon([20.0, 5.0]) < 1 <= opacus_epsilon([20.0, 5.0, 3.0])
    assert warmup_releases.release_names(load_config(GENERIC, overrides=["privacy.epsilon=3", "warmup.variations=0"])) \
        == ["intensity_histogram", "class_means", "polarity_shapes"]


def test_a_histogram_that_alone_does_not_fit_is_still_refused():
    cfg = load_config(GENERIC, overrides=["privacy.epsilon=0.02"])
    assert opacus_epsilon([20.0]) > 0.02
    assert warmup_releases.release_names(cfg) == ["intensity_histogram", "class_means"]
    with pytest.raises(PrivacyError, match="privacy.epsilon: 0.02 is spent by the warm-up's releases alone"):
        warmup_releases.prefix(cfg, accountant="rdp")
