"""``dpsynth privacy epsilon|noise`` through a parser built from this module's ``register``."""

import argparse
import json

import pytest

from dpsynth.errors import PrivacyError
from dpsynth.privacy import cli


def run(argv, capsys):
    parser = argparse.ArgumentParser(prog="dpsynth")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().out


OPACUS_ANCHOR = ["--sample-rate", "0.04", "--steps", "2250", "--delta", "1e-5"]


def test_epsilon_json(capsys):
    code, out = run(["privacy", "epsilon", "--noise-multiplier", "1.5", *OPACUS_ANCHOR, "--json"], capsys)
    result = json.loads(out)
    assert code == 0
    assert {"epsilon", "delta", "accountant", "sample_rate", "steps", "noise_multiplier"} <= set(result)
    assert result["epsilon"] == pytest.approx(7.32911117143, abs=1e-9)  # Opacus' RDP anchor
    assert (result["accountant"], result["steps"], result["sample_rate"], result["delta"]) == ("rdp", 2250, 0.04, 1e-5)


def test_epsilon_text_with_prv(capsys):
    code, out = run(["privacy", "epsilon", "--noise-multiplier", "1.5", *OPACUS_ANCHOR, "--accountant", "prv"], capsys)
    assert code == 0 and out.count("\n") == 1
    assert "epsilon <= 6.779" in out and "prv" in out


def test_noise_json(capsys):
    code, out = run(["privacy", "noise", "--epsilon", "8", "--sample-rate", "0.04", "--steps", "2000",
                     "--delta", "1e-5", "--json"], capsys)
    result = json.loads(out)
    assert code == 0
    assert {"epsilon", "delta", "accountant", "sample_rate", "steps", "noise_multiplier", "target_epsilon"} <= set(result)
    assert result["noise_multiplier"] == pytest.approx(1.3562, rel=0.012)  # Opacus' get_noise_multiplier anchor
    assert result["epsilon"] <= 8.0


def test_noise_text(capsys):
    code, out = run(["privacy", "noise", "--epsilon", "3", "--sample-rate", "0.01", "--steps", "1000",
                     "--delta", "1e-5"], capsys)
    assert code == 0 and out.startswith("noise multiplier ") and "target 3" in out


@pytest.mark.parametrize(
    "argv, field",
    [
        (["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "10", "--delta", "1.5"], "delta"),
        (["epsilon", "--noise-multiplier", "0", "--sample-rate", "0.01", "--steps", "10", "--delta", "1e-5"],
         "noise_multiplier"),
        (["epsilon", "--noise-multiplier", "1", "--sample-rate", "2", "--steps", "10", "--delta", "1e-5"],
         "sample_rate"),
        (["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "-1", "--delta", "1e-5"], "steps"),
        (["noise", "--epsilon", "-1", "--sample-rate", "0.01", "--steps", "10", "--delta", "1e-5"], "target_epsilon"),
        (["noise", "--epsilon", "1", "--sample-rate", "0.01", "--steps", "0", "--delta", "1e-5"], "steps"),
    ],
)
def test_bad_values_raise_privacy_error_naming_the_field(argv, field, capsys):
    # the top-level CLI turns a DpsynthError into exit code 2
    with pytest.raises(PrivacyError, match=f"^{field}: "):
        run(["privacy", *argv], capsys)


def test_unknown_accountant_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["privacy", "epsilon", "--noise-multiplier", "1", *OPACUS_ANCHOR, "--accountant", "moments"], capsys)
    assert exit_info.value.code == 2


@pytest.mark.parametrize("action", ["epsilon", "noise"])
def test_help(action, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run(["privacy", action, "--help"], capsys)
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert "--sample-rate" in out and "--accountant" in out and "upper bound" in out
