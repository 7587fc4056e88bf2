"""What every trainer shares: its result record, its MLflow run, its device.

A trainer's MLflow run (:func:`mlflow_run`) is nested under the pipeline's parent run, tagged, and
gets the config and the trainer's data-independent ``derived.*`` parameters before the first step;
it honours ``tracking.artifact_location``. What else a trainer may log it declares
(``Trainer.MLFLOW_KEYS``); nothing before the gate (no image, model or dataset hash).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

import torch

from dpsynth import tracking
from dpsynth.config import dump_config
from dpsynth.errors import PrivacyError


@dataclass(frozen=True)
class TrainResult:
    """What ``train()`` returns and writes to ``result.json``, the same for every method."""

    epsilon: float  # the sound ε of the recorded trace (always; also under as_published accounting)
    delta: float
    accountant: str
    steps: int  # private steps (= mechanism events in the trace)
    generator_steps: int
    noise_multiplier: float  # the method's σ as configured or calibrated (see its module)
    sample_rate: float
    stopped_by: str  # "steps": the step budget was reached; "budget": the next step would exceed ε
    output_dir: str
    generator_path: str
    trace_path: str
    grid_path: str
    mlflow_run_id: str | None
    seconds: float
    accounting: str = "sound"  # "sound" | "as_published" (a paper's own account: the audit refuses the release)
    epsilon_as_published_unsound: float | None = None  # as_published only: the paper's (unsound) ε
    details: dict = field(default_factory=dict)  # method-specific, data-independent facts of the run


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise PrivacyError("train.device: 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def flatten(d: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}`` (the config as MLflow parameters)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


@contextlib.contextmanager
def mlflow_run(trainer, *, derived: dict) -> Iterator[object | None]:
    """The trainer's MLflow run, None when tracking is off. ``trainer`` has ``cfg``, ``out``,
    ``dataset_name``, ``parent_run_id`` and ``run_tags``; ``derived`` its ``derived.*`` parameters."""
    cfg = trainer.cfg
    if not cfg.tracking.enabled:
        yield None
        return
    import mlflow

    tr = cfg.tracking
    with tracking.start_run(tracking_uri=tr.uri or tracking.default_tracking_uri(trainer.out),
                            experiment=tr.experiment or tracking.experiment_name(trainer.dataset_name),
                            stage="train", run_name=f"train-{cfg.train.method}", parent_run_id=trainer.parent_run_id,
                            tags={tracking.TAG_METHOD: cfg.train.method, **trainer.run_tags},
                            artifact_location=tr.artifact_location) as run:
        tracking.log_run(trainer.MLFLOW_KEYS, params={**flatten(cfg.to_dict()),
                                                      **{f"derived.{k}": v for k, v in derived.items()}})
        mlflow.log_text(dump_config(cfg), "config.yaml")
        yield run
