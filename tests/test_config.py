import pytest

from dpsynth.config import RunConfig, load_config
from dpsynth.errors import ConfigError


def test_defaults_validate():
    cfg = load_config()
    assert isinstance(cfg, RunConfig) and cfg.privacy.epsilon == 10.0


def test_yaml_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("privacy:\n  epsilon: 2\ntrain:\n  n_d: 5\n")
    cfg = load_config(f, overrides=["train.steps=10", "privacy.accountant=prv"])
    assert (cfg.privacy.epsilon, cfg.train.n_d, cfg.train.steps, cfg.privacy.accountant) == (2.0, 5, 10, "prv")


@pytest.mark.parametrize("override,field", [
    ("privacy.epsilon=0", "privacy.epsilon"),
    ("privacy.delta=1.5", "privacy.delta"),
    ("privacy.delta=abc", "privacy.delta"),
    ("privacy.accountant=moments", "privacy.accountant"),
    ("train.n_d=fast", "train.n_d"),
    ("train.steps=0", "train.steps"),
    ("train.steps=2.5", "train.steps"),
    ("train.batchsize=3", "train.batchsize"),
    ("bogus.x=1", "bogus"),
])
def test_errors_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(overrides=[override])


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError, match="config file"):
        load_config(tmp_path / "missing.yaml")


def test_fingerprint_ignores_output_and_tracking():
    a = load_config(overrides=["output.dir=/a"])
    b = load_config(overrides=["output.dir=/b", "tracking.enabled=false"])
    c = load_config(overrides=["train.seed=3"])
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


@pytest.mark.parametrize("method,expected", [("dpgan", "adaptive"), ("gswgan", 5), ("dpac", 5), ("zhang", 4),
                                             ("gswgan_federated", 5)])
def test_one_name_for_discriminator_steps_per_generator_step(tmp_path, method, expected):
    """train.n_d is n_D (Bie et al.), n_dis (GS-WGAN) and n_critic (dp-GAN); unset, each paper's own default (its
    Method.default_n_d)."""
    from dpsynth.methods import discriminator_steps, registry

    default = registry.get(method).default_n_d
    assert default == expected
    assert discriminator_steps.n_d(registry.load_config(overrides=[f"train.method={method}"]), default) == expected
    assert discriminator_steps.n_d(load_config(overrides=[f"train.method={method}", "train.n_d=3"]), default) == 3
    if method != "dpgan":
        with pytest.raises(ConfigError, match=r"^train\.n_d: 'adaptive' is DPGAN's policy"):
            registry.load_config(overrides=[f"train.method={method}", "train.n_d=adaptive"])


@pytest.mark.parametrize("old", ["gswgan.n_dis", "zhang.n_critic"])
def test_the_old_names_are_refused_with_the_new_one(tmp_path, old):
    section, field = old.split(".")
    with pytest.raises(ConfigError, match=rf"^{old}: renamed train\.n_d"):
        load_config(overrides=[f"{old}=5"])
    f = tmp_path / "old.yaml"
    f.write_text(f"{section}:\n  {field}: 5\n")
    with pytest.raises(ConfigError, match=rf"^{old}: renamed train\.n_d"):
        load_config(f)


# --- Private Evolution's section (#51) ------------------------------------------------------------------------


@pytest.mark.parametrize("override,field", [
    ("evolution.rounds=0", "evolution.rounds"),
    ("evolution.rounds=2.5", "evolution.rounds"),
    ("evolution.candidates=1", "evolution.candidates"),
    ("evolution.threshold=-1", "evolution.threshold"),
    ("evolution.step_first=0", "evolution.step_first"),
    ("evolution.step_last=0.5", "evolution.step_last"),  # above step_first (0.3)
    ("evolution.fresh=1", "evolution.fresh"),
    ("evolution.jitter=2", "evolution.jitter"),
    ("evolution.seed=-1", "evolution.seed"),
    ("evolution.temperature=1", "evolution.temperature"),
    ("train.method=private_evolution", "train.method"),
])
def test_bad_evolution_settings_are_refused_naming_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(overrides=["train.method=private-evolution", override])


def test_private_evolution_reads_no_warm_up():
    from dpsynth.methods import registry

    with pytest.raises(ConfigError, match=r"warmup\.central_images"):
        registry.load_config(overrides=["train.method=private-evolution", "warmup.central_images=true"])
    cfg = load_config(overrides=["train.method=private-evolution"])
    assert (cfg.evolution.rounds, cfg.evolution.candidates, cfg.evolution.threshold) == (10, 200, 2.0)


def test_private_evolution_sigma_is_calibrated_from_epsilon_for_every_accountant_of_the_audit():
    """σ from ε by calibrate(), the largest the accountants that account full-batch releases need; H = threshold·σ."""
    from dpsynth.mechanisms.histograms import PRIVATE_EVOLUTION, calibrate, rounds_epsilon

    cfg = load_config(overrides=["train.method=private-evolution", "privacy.epsilon=10", "privacy.delta=1e-5"])
    plan = PRIVATE_EVOLUTION.plan(cfg, 8000)
    sigma = plan.noise_multiplier
    assert sigma == max(calibrate(epsilon=10, delta=1e-5, rounds=10, accountant=a) for a in ("rdp", "wor"))
    assert plan.steps == 10 and plan.event.sampling == "full_batch" and plan.event.sample_rate == 1.0
    for accountant in ("rdp", "wor"):
        assert rounds_epsilon(10, sigma, delta=1e-5, accountant=accountant) <= 10
    assert PRIVATE_EVOLUTION.threshold(cfg, plan) == pytest.approx(2 * sigma)
    fixed = load_config(overrides=["train.method=private-evolution", "privacy.noise_multiplier=0.5"])
    from dpsynth.errors import PrivacyError

    with pytest.raises(PrivacyError, match=r"privacy\.noise_multiplier"):
        PRIVATE_EVOLUTION.plan(fixed, 8000)  # 10 rounds at σ = 0.5 spend far more than ε = 10
