"""Names settled (#53 item 3): the non-private stage is "pre-training" (``dpsynth pretrain``, section
``pretrain``), so that "warm-up" names only the private releases. An old name is refused with the new one."""

from __future__ import annotations

import pytest

from dpsynth import cli
from dpsynth.config import ConfigError, load_config


@pytest.mark.parametrize("old,new,value", [
    ("warmstart.workers", "pretrain", "2"),
    ("gswgan.warmstart_iterations", "gswgan.pretrain_iterations", "5"),
    ("zhang.warm_start_iterations", "zhang.pretrain_iterations", "5"),
])
def test_an_old_setting_is_refused_with_the_new_name(tmp_path, old, new, value):
    name = old if not old.startswith("warmstart.") else "warmstart"
    with pytest.raises(ConfigError, match=rf"^{name}: renamed {new}$"):
        load_config(overrides=[f"{old}={value}"])
    section, field = old.split(".")
    f = tmp_path / "old.yaml"
    f.write_text(f"{section}:\n  {field}: {value}\n")
    with pytest.raises(ConfigError, match=rf"^{name}: renamed {new}$"):
        load_config(f)


def test_the_new_settings_load():
    cfg = load_config(overrides=["pretrain.workers=2", "gswgan.pretrain_iterations=5", "zhang.pretrain_iterations=5"])
    assert (cfg.pretrain.workers, cfg.gswgan.pretrain_iterations, cfg.zhang.pretrain_iterations) == (2, 5, 5)


def test_the_old_command_is_refused_with_the_new_one(capsys):
    assert cli.main(["-v", "warmstart", "--run-dir", "x"]) == 2
    assert "`dpsynth warmstart` is now `dpsynth pretrain`" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["pretrain", "--help"])
    assert exc.value.code == 0
