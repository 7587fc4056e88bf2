"""What a trainer leaves in its (sensitive) output directory, each format written and read in one place.

* the generator file, ``dpsynth.generator/1``: ``{"format", "state_dict", "model": {"class", **kwargs},
  "privacy": {..., "trace_sha256", "trace_steps"}}`` — :func:`generator_bytes` writes it, binding it
  to the mechanism trace it was trained under (the sha256 of :func:`trace_bytes` and its step count;
  the audit and the sample stage refuse a generator whose binding does not match the audited trace),
  :func:`load_generator` reads it back (the sample and evaluate stages, after the audit);
* sample grids (PNG), for people with access to the sensitive zone: trainers log no image to MLflow,
  the sample stage logs grids of the audited generator;
* the pre-training files (a method's non-private models, sensitive zone): ``{"format", **state}`` —
  :func:`model_file_bytes` writes one, :func:`read_model_file` reads it back after checking its format.
"""

from __future__ import annotations

import hashlib
import importlib
import io
from pathlib import Path

import torch

from dpsynth import storage
from dpsynth.errors import ConfigError, StageError

GENERATOR_FORMAT = "dpsynth.generator/1"
# The generator classes a generator file may name (an allow-list: the file is data, not code).
# Each is built with the file's "model" keywords and is a dpsynth.models.dcgan.ConditionalGenerator: a
# ``num_classes`` attribute and ``sample(n, labels=, generator=) -> (images in [-1, 1] NCHW, labels)``.
# Private Evolution's release (dpsynth.prior.release.FigurePainter) has the same interface; its state is the released
# figures and their weights, no network (it is not an nn graph torch.export takes: tracking.log_generator)
GENERATOR_CLASSES = ("dpsynth.models.dcgan.Generator", "dpsynth.models.gswgan_networks.Generator",
                     "dpsynth.prior.release.FigurePainter")


def trace_bytes(trace) -> bytes:
    """The bytes of ``trace.json`` (a MechanismTrace), as every trainer writes them."""
    return trace.to_json().encode()


def trace_binding(trace) -> dict:
    """What a generator file records of the trace it was trained under."""
    return {"trace_sha256": hashlib.sha256(trace_bytes(trace)).hexdigest(), "trace_steps": trace.steps}


def generator_bytes(state_dict: dict, *, model: dict, privacy: dict, trace) -> bytes:
    """A ``dpsynth.generator/1`` file: ``model`` names the class (one of GENERATOR_CLASSES) and its keywords;
    ``privacy`` gets the binding to ``trace`` (:func:`trace_binding`)."""
    if model.get("class") not in GENERATOR_CLASSES:
        raise ValueError(f"model class {model.get('class')!r} is not one of {GENERATOR_CLASSES}")
    buf = io.BytesIO()
    torch.save({"format": GENERATOR_FORMAT, "state_dict": state_dict, "model": model,
                "privacy": {**privacy, **trace_binding(trace)}}, buf)
    return buf.getvalue()


def generator_privacy(uri: str) -> dict:
    """The privacy record of a generator file (no model is built); StageError when it is not one."""
    state = _read(uri)
    return state["privacy"] if isinstance(state.get("privacy"), dict) else {}


def _read(uri: str) -> dict:
    state = torch.load(io.BytesIO(storage.read_bytes(uri)), map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != GENERATOR_FORMAT:
        raise StageError(f"{uri}: not a dpsynth generator (expected format {GENERATOR_FORMAT!r})")
    return state


def build_generator(model: dict) -> torch.nn.Module:
    """A fresh generator from a ``model`` record: its "class" (one of GENERATOR_CLASSES) and keywords."""
    model = dict(model)
    name = model.pop("class", "dpsynth.models.dcgan.Generator")
    if name not in GENERATOR_CLASSES:
        raise ValueError(f"unknown generator class {name!r} (known: {', '.join(GENERATOR_CLASSES)})")
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)(**model)


def load_generator(uri: str) -> tuple[torch.nn.Module, dict]:
    """The generator a trainer saved (``dpsynth.generator/1``) and its privacy record."""
    state = _read(uri)
    try:
        generator = build_generator(state["model"])
    except ValueError as exc:
        raise StageError(f"{uri}: {exc}") from None
    generator.load_state_dict(state["state_dict"])
    return generator.eval(), state["privacy"]


def write_grid(path: str | Path, image) -> None:
    """A PIL image as a PNG file (atomically)."""
    with storage.atomic_write(path) as fh:
        image.save(fh, format="PNG")


def model_file_bytes(fmt: str, state: dict) -> bytes:
    """The bytes of a pre-training file of format ``fmt``: ``{"format": fmt, **state}``."""
    buf = io.BytesIO()
    torch.save({"format": fmt, **state}, buf)
    return buf.getvalue()


def read_model_file(data: bytes, fmt: str, *, refusal: str, weights_only: bool = True) -> dict:
    """The state of a pre-training file (:func:`model_file_bytes`); ConfigError ``refusal`` unless it is one of ``fmt``."""
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=weights_only)
    if not isinstance(state, dict) or state.get("format") != fmt:
        raise ConfigError(refusal)
    return state
