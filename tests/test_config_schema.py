"""The configuration's one JSON Schema: exported from the models, kept in sync where the repository
copies it (the DAGs' folder, the chart's values.schema.json), and saying what the models check.

The schema is checked against the models with a second validator (``jsonschema``): a setting the models
refuse, the schema refuses too, and the other way round (the checks across settings excepted, which only
the models make)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from dpsynth import cli
from dpsynth.config import _Loader, json_schema, load_config
from dpsynth.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("config_schema_script", REPO / "scripts" / "config_schema.py")
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)


def test_committed_copies_are_in_sync():
    for path, text in script.expected().items():
        assert path.read_text(encoding="utf-8") == text, f"{path.relative_to(REPO)} is stale: run `make schema`"
    values = json.loads(script.VALUES_SCHEMA.read_text(encoding="utf-8"))
    assert values["$defs"]["dpsynthConfig"] == json_schema()
    assert values["properties"]["stage"]["properties"]["config"] == {
        "$ref": json_schema()["$id"], "description": values["properties"]["stage"]["properties"]["config"]["description"]}


def test_check_mode_finds_a_stale_copy(tmp_path, monkeypatch):
    stale = tmp_path / "dpsynth_config.schema.json"
    stale.write_text(script.DAG_SCHEMA.read_text(encoding="utf-8").replace('"minimum": 1', '"minimum": 2', 1))
    values = tmp_path / "values.schema.json"
    values.write_text(script.VALUES_SCHEMA.read_text(encoding="utf-8"))
    monkeypatch.setattr(script, "DAG_SCHEMA", stale)
    monkeypatch.setattr(script, "VALUES_SCHEMA", values)
    assert script.main(["--check"]) == 1
    assert script.main([]) == 0 and script.main(["--check"]) == 0  # rewritten from the models


def test_cli_prints_the_schema(capsys):
    assert cli.main(["config", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(script.DAG_SCHEMA.read_text(encoding="utf-8"))


def test_the_schema_is_valid_and_describes_every_setting():
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    defaults = load_config().to_dict()
    assert set(schema["properties"]) == set(defaults)
    for section, fields in defaults.items():
        definition = schema["$defs"][schema["properties"][section]["$ref"].rsplit("/", 1)[1]]
        assert definition["additionalProperties"] is False and set(definition["properties"]) == set(fields)
        for field, value in fields.items():
            if field != "uri" or section != "data":  # data.uri's default is a path in this checkout: not exported
                assert definition["properties"][field]["default"] == value, (section, field)
    jsonschema.validate({s: {k: v for k, v in f.items() if (s, k) != ("data", "uri")} for s, f in defaults.items()},
                        schema)
    assert "description" in schema["$defs"]["PrivacyConfig"]["properties"]["epsilon"]


VALIDATOR = jsonschema.Draft202012Validator(json_schema())


def _yaml(value: str):
    return yaml.load(value, Loader=_Loader)


# (section.field=value): what the models and the schema both refuse, or both take
REFUSED = ["privacy.epsilon=0", "privacy.epsilon=-1", "privacy.delta=1", "privacy.delta=abc", "privacy.accountant=moments",
           "privacy.epsilon=true", "train.n_d=fast", "train.n_d=0", "train.n_d='5'", "train.steps=0", "train.steps=2.5",
           "train.steps=true", "train.steps='7'", "train.batchsize=3", "bogus=1", "tracking.enabled=1",
           "ledger.population_id=600", "ledger.population_id=' '", f"ledger.population_id={'x' * 201}", "warmup.styles=7",
           "data.heldout_fraction=1", "data.num_classes=1", "zhang.lr_g=0", "evaluate.max_train_records=5",
           "data.uri=''", "train=5", "train.seed=-1", "privacy.noise_multiplier=-0.5"]
TAKEN = ["privacy.epsilon=3", "privacy.delta=1e-6", "privacy.delta=1.5e-6", "train.n_d=5", "train.n_d=adaptive",
         "ledger.population_id=mnist", "ledger.population_id=null", "zhang.lr_g=null", "zhang.lr_g=1e-4",
         "evaluate.max_train_records=null", "warmup.styles=6", "privacy.noise_multiplier=2"]


@pytest.mark.parametrize("override", REFUSED)
def test_models_and_schema_refuse_alike(override):
    key, raw = override.split("=", 1)
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.") + ": "):
        load_config(overrides=[override])
    section, _, field = key.partition(".")
    document = {section: {field: _yaml(raw)}} if field else {section: _yaml(raw)}
    assert not VALIDATOR.is_valid(document)


@pytest.mark.parametrize("override", TAKEN)
def test_models_and_schema_take_alike(override):
    key, raw = override.split("=", 1)
    section, field = key.split(".")
    cfg = load_config(overrides=[override])
    assert getattr(getattr(cfg, section), field) == _yaml(raw)
    VALIDATOR.validate({section: {field: _yaml(raw)}})


def test_a_number_with_an_exponent_is_a_number(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("privacy:\n  delta: 1e-5\n  epsilon: 2\n")  # YAML 1.1 (PyYAML) would read 1e-5 as a string
    cfg = load_config(f)
    assert cfg.privacy.delta == 1e-5 and isinstance(cfg.privacy.epsilon, float)


def test_every_bad_setting_is_named_once(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  steps: 0\n  n_d: sometimes\n  stepz: 3\nprivacy:\n  epsilon: -1\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    lines = str(info.value).splitlines()
    assert sorted(line.split(":")[0] for line in lines) == ["privacy.epsilon", "train.n_d", "train.steps", "train.stepz"]
    assert "train.n_d: must be an integer >= 1 or 'adaptive' or null, got 'sometimes'" in lines
    assert "privacy.epsilon: must be a number > 0, got -1" in lines
    assert any(line.startswith("train.stepz: unknown setting (known: adam_beta1,") for line in lines)


def test_checks_across_settings_keep_their_messages():
    from dpsynth.methods import registry

    with pytest.raises(ConfigError, match=r"^audit\.empirical: the empirical audit supports"):
        registry.load_config(overrides=["train.method=gswgan_federated", "audit.empirical=quick"])
    with pytest.raises(ConfigError, match=r"^data\.public_split: declare public data by public_split or by"):
        load_config(overrides=["data.public_split=p", "data.public_fraction=0.1", "data.public_fraction_unprotected=true"])


def test_the_cli_exits_2_naming_the_setting(capsys, monkeypatch):
    """``dpsynth.cli.main`` in this process (``python -m dpsynth.cli`` exits with what it returns; a new interpreter
    would cost its imports of torch and every method, not a different path)."""
    monkeypatch.chdir(REPO)
    capsys.readouterr()
    assert cli.main(["config", "show", "--set", "privacy.delta=2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == "dpsynth: error: privacy.delta: must be a number in (0, 1), got 2"
