"""The trigger form's fields, built from dpsynth's configuration schema.

``dpsynth_config.schema.json`` beside this file is ``dpsynth config schema``'s output (the Airflow
environment has no dpsynth to import; ``scripts/config_schema.py`` writes it and a test keeps it equal to
the models). ``param("privacy.epsilon", title=...)`` is the form field of one setting: its type, bounds,
choices, default and description come from the schema, so the form refuses what the stage would refuse
(the checks across settings excepted: the stages make those).

The platform's settings, ``DPSYNTH_STAGE_CONFIG`` (a Variable or environment variable holding a JSON
mapping of sections, as in a config file; the chart's ``stage.config``), replace the schema's defaults;
:func:`extra_settings` lists those the form has no field for.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import dpsynth_pods as pods

SCHEMA = json.loads(Path(__file__).with_name("dpsynth_config.schema.json").read_text(encoding="utf-8"))
# The JSON Schema keywords a form field keeps (Airflow validates them when a run is triggered).
KEYWORDS = ("type", "enum", "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "minLength", "maxLength",
            "pattern")


def platform() -> dict:
    """The platform's settings: {section: {field: value}} (empty when none are set)."""
    return json.loads(pods.setting("DPSYNTH_STAGE_CONFIG") or "{}")


def setting(name: str) -> dict:
    """The JSON Schema of one setting, e.g. ``privacy.epsilon``."""
    section, field = name.split(".")
    definition = SCHEMA["properties"][section]["$ref"].rsplit("/", 1)[1]
    return SCHEMA["$defs"][definition]["properties"][field]


def field_schema(name: str) -> dict:
    """The form field's JSON Schema keywords for a setting. Every field is nullable, ``type: [null, T]`` (choices
    include null): empty means the base config's value. A setting that is an integer or a word (``train.n_d``: 5
    or "adaptive") is a text field with a pattern."""
    options = setting(name).get("anyOf", [setting(name)])
    values = [o for o in options if o.get("type") != "null"]
    if len(values) == 1:
        out = {k: values[0][k] for k in KEYWORDS if k in values[0]}
    else:
        words = [o["const"] for o in values if "const" in o]
        numbers = [o for o in values if o.get("type") == "integer"]
        if not (len(numbers) == 1 and len(words) == len(values) - 1 and numbers[0].get("minimum", 0) in (0, 1)):
            raise ValueError(f"{name}: no form field for the schema {setting(name)}")
        digits = "[1-9][0-9]*" if numbers[0].get("minimum") == 1 else "[0-9]+"
        out = {"type": "string", "pattern": f"^({'|'.join(map(re.escape, words))}|{digits})$"}
    out["type"] = ["null", out["type"]]
    if "enum" in out:
        out["enum"] = [None, *out["enum"]]
    return out


def default(name: str):
    """The platform's value of a setting (``DPSYNTH_STAGE_CONFIG``), else None: the base config's. Never the
    schema's default, which would replace the config's recipe."""
    section, field = name.split(".")
    value = platform().get(section, {}).get(field)
    return str(value) if value is not None and "string" in field_schema(name)["type"] else value


def param(name: str, value=None, **keywords):
    """The form field (``Param``) of setting ``name``: ``value`` or :func:`default`, the setting's schema and
    description; ``keywords`` (a title, a longer description) are added last."""
    from airflow.sdk import Param

    schema = {**field_schema(name), "description": setting(name).get("description", "")}
    return Param(default(name) if value is None else value, **{**schema, **keywords})


def extra_settings(shown: set[str]) -> list[str]:
    """The platform's settings that are a run's (``dpsynth_pods.RUN_SETTINGS``) and that the form shows no field
    for, as ``section.field=value`` (JSON is YAML): the default of the extra settings. The platform's other settings
    are not the trigger's to keep or drop: ``dpsynth_pods.overrides`` gives them to every stage after the trigger's."""
    return [f"{section}.{field}={json.dumps(value)}" for section, fields in platform().items()
            for field, value in fields.items() if f"{section}.{field}" not in shown
            and f"{section}.{field}" in pods.RUN_SETTINGS]


# What the extra settings' items look like; which settings they may name (the allow-list) is checked by the plan
# task, the run's first, with one line per refused setting naming who sets it (a JSON Schema pattern of the list
# would be refused by Airflow with the whole pattern, 3,591 characters, as its message).
SETTING_ITEM = r"^[a-z_]+\.[a-z0-9_]+\s*=.*$"


def run_settings_text() -> str:
    """The run settings in words, for the extra settings' description: "train.*, privacy.epsilon, …"."""
    sections: dict[str, list[str]] = {}
    for name in sorted(pods.RUN_SETTINGS):
        section, field = name.split(".")
        sections.setdefault(section, []).append(field)
    every = {section for section, ref in SCHEMA["properties"].items()
             if len(SCHEMA["$defs"][ref["$ref"].rsplit("/", 1)[1]]["properties"]) == len(sections.get(section, ()))}
    return ", ".join(f"{section}.*" if section in every else ", ".join(f"{section}.{f}" for f in fields)
                     for section, fields in sections.items())
