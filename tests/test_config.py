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
    """train.n_d is n_D (Bie et al.), n_dis (GS-WGAN) and n_critic (dp-GAN); unset, each paper's own default."""
    from dpsynth.methods import discriminator_steps

    assert discriminator_steps.n_d(load_config(overrides=[f"train.method={method}"])) == expected
    assert discriminator_steps.n_d(load_config(overrides=[f"train.method={method}", "train.n_d=3"])) == 3
    if method != "dpgan":
        with pytest.raises(ConfigError, match=r"^train\.n_d: 'adaptive' is DPGAN's policy"):
            load_config(overrides=[f"train.method={method}", "train.n_d=adaptive"])


@pytest.mark.parametrize("old", ["gswgan.n_dis", "zhang.n_critic"])
def test_the_old_names_are_refused_with_the_new_one(tmp_path, old):
    section, field = old.split(".")
    with pytest.raises(ConfigError, match=rf"^{old}: renamed train\.n_d"):
        load_config(overrides=[f"{old}=5"])
    f = tmp_path / "old.yaml"
    f.write_text(f"{section}:\n  {field}: 5\n")
    with pytest.raises(ConfigError, match=rf"^{old}: renamed train\.n_d"):
        load_config(f)
