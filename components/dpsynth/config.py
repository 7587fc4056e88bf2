"""One typed, validated configuration per run: frozen dataclasses, loaded from YAML plus
``--set section.field=value`` overrides, checked at the edge with errors that name the field.

>>> cfg = load_config(overrides=["privacy.epsilon=3", "train.steps=200"])
>>> cfg.privacy.epsilon, cfg.train.steps
(3.0, 200)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from dpsynth.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATASET = str(REPO_ROOT / "data" / "mnist")


@dataclass(frozen=True)
class DataConfig:
    uri: str = DEFAULT_DATASET  # canonical Parquet, or any source `dpsynth data import` reads
    num_classes: int | None = None  # None: taken from the dataset
    train_split: str | None = None  # None: every record is sensitive training data
    # The pipeline holds out the records whose keyed hash (see PartitionConfig) falls below this
    # fraction; `evaluate` tests on them and they are never trained on. 0: nothing held out.
    heldout_fraction: float = 0.1

    def validate(self) -> None:
        _require(bool(self.uri), "data.uri", "must name a dataset")
        _require(self.num_classes is None or self.num_classes >= 2, "data.num_classes", "must be >= 2")
        _require(0 <= self.heldout_fraction < 1, "data.heldout_fraction", f"must be in [0, 1), got {self.heldout_fraction}")


@dataclass(frozen=True)
class PrivacyConfig:
    epsilon: float = 10.0
    delta: float = 1e-5
    accountant: Literal["rdp", "prv"] = "rdp"
    noise_multiplier: float | None = None  # None: calibrated so `train.steps` spends exactly ≤ epsilon
    max_grad_norm: float = 1.0
    # sound: our accounting (DESIGN.md). as_published: reproduce a paper's own (unsound) account;
    # such a run is marked unsound and the audit never passes it.
    accounting: Literal["sound", "as_published"] = "sound"

    def validate(self) -> None:
        _require(self.epsilon > 0, "privacy.epsilon", f"must be > 0, got {self.epsilon}")
        _require(0 < self.delta < 1, "privacy.delta", f"must be in (0, 1), got {self.delta}")
        _require(self.noise_multiplier is None or self.noise_multiplier > 0, "privacy.noise_multiplier", "must be > 0")
        _require(self.max_grad_norm > 0, "privacy.max_grad_norm", f"must be > 0, got {self.max_grad_norm}")


@dataclass(frozen=True)
class TrainConfig:
    # dpgan: Bie et al.; gswgan / dpac: GS-WGAN and DP-GAN-DPAC (sections `gswgan`, `dpac`);
    # zhang: dp-GAN of Zhang, Ji & Wang (section `zhang`)
    method: Literal["dpgan", "gswgan", "dpac", "zhang"] = "dpgan"
    steps: int = 2000  # discriminator (private) steps T; training stops earlier only at the ε budget
    batch_size: int = 128  # expected Poisson batch size B; q = B / n
    physical_batch_size: int | None = None  # memory cap per forward/backward; None: no cap
    n_d: int | Literal["adaptive"] = "adaptive"
    n_d_threshold: float = 0.6
    n_d_beta: float = 0.99
    lr_d: float = 2e-4
    lr_g: float = 2e-4
    adam_beta1: float = 0.5
    adam_beta2: float = 0.999
    d_width: int = 128
    g_width: int = 128
    latent_dim: int = 100
    grad_sample_mode: Literal["hooks", "ew"] = "ew"
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"

    def validate(self) -> None:
        _require(self.steps >= 1, "train.steps", f"must be >= 1, got {self.steps}")
        _require(self.batch_size >= 1, "train.batch_size", f"must be >= 1, got {self.batch_size}")
        _require(self.physical_batch_size is None or self.physical_batch_size >= 1, "train.physical_batch_size", "must be >= 1")
        if self.n_d != "adaptive":
            _require(isinstance(self.n_d, int) and self.n_d >= 1, "train.n_d", f"must be 'adaptive' or an integer >= 1, got {self.n_d!r}")
        _require(0 <= self.n_d_threshold <= 1, "train.n_d_threshold", "must be in [0, 1]")
        _require(0 < self.n_d_beta < 1, "train.n_d_beta", "must be in (0, 1)")
        for name in ("lr_d", "lr_g"):
            _require(getattr(self, name) > 0, f"train.{name}", "must be > 0")
        for name in ("d_width", "g_width", "latent_dim"):
            _require(getattr(self, name) >= 1, f"train.{name}", "must be >= 1")


@dataclass(frozen=True)
class OutputConfig:
    dir: str = "outputs/run"
    checkpoint_every: int = 500  # discriminator steps between checkpoints; 0 disables
    sample_every: int = 500  # discriminator steps between sample grids logged to MLflow
    log_every: int = 50  # discriminator steps between metric logs
    resume: bool = True  # continue from the last checkpoint in `dir` if there is one

    def validate(self) -> None:
        for name in ("checkpoint_every", "sample_every", "log_every"):
            _require(getattr(self, name) >= 0, f"output.{name}", "must be >= 0")


@dataclass(frozen=True)
class TrackingConfig:
    uri: str | None = None  # None: sqlite database in the output dir
    experiment: str | None = None  # None: one experiment per dataset, named after it
    enabled: bool = True


@dataclass(frozen=True)
class PartitionConfig:
    """How `dpsynth partition` assigns records: HMAC-SHA256(key, record_id), so a record's shard
    (and whether it is held out) depends on its id alone, never on the other records."""

    num_shards: int = 1  # K training shards (DPGAN trains on their union; GS-WGAN one D per shard)
    # Fixed per population: changing it reassigns every record, so records held out under one key
    # would be trained on under another. Not needed for the DP guarantee, but keep it private so
    # that outsiders cannot tell which records were held out.
    key: str = "dpsynth-partition-v1"

    def validate(self) -> None:
        _require(self.num_shards >= 1, "partition.num_shards", f"must be >= 1, got {self.num_shards}")
        _require(bool(self.key), "partition.key", "must be a non-empty string")


@dataclass(frozen=True)
class SampleConfig:
    num_samples: int = 10000  # synthetic records written by `dpsynth sample`, classes balanced
    per_class: int = 10  # columns of the sample grid (one row per class)
    seed: int = 0

    def validate(self) -> None:
        _require(self.num_samples >= 1, "sample.num_samples", f"must be >= 1, got {self.num_samples}")
        _require(self.per_class >= 1, "sample.per_class", f"must be >= 1, got {self.per_class}")


@dataclass(frozen=True)
class EvaluateConfig:
    classifier: Literal["logreg", "cnn"] = "logreg"  # trained on synthetic data, tested on held-out real data
    max_iter: int = 200  # logreg: solver iterations
    epochs: int = 5  # cnn: passes over the synthetic data
    seed: int = 0

    def validate(self) -> None:
        _require(self.max_iter >= 1, "evaluate.max_iter", f"must be >= 1, got {self.max_iter}")
        _require(self.epochs >= 1, "evaluate.epochs", f"must be >= 1, got {self.epochs}")


@dataclass(frozen=True)
class PipelineConfig:
    run_dir: str | None = None  # root URI (local or s3://) of one pipeline run: run_dir/sensitive, run_dir/release


@dataclass(frozen=True)
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)

    def validate(self) -> "RunConfig":
        for section in dataclasses.fields(self):
            value = getattr(self, section.name)
            if hasattr(value, "validate"):
                value.validate()
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def fingerprint(
        self, *, exclude: tuple[str, ...] = ("output", "tracking", "sample", "evaluate", "pipeline")
    ) -> str:
        """sha256 of the settings that determine the training result (what resume must match)."""
        d = {k: v for k, v in self.to_dict().items() if k not in exclude}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


def _require(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{name}: {message}")


def _coerce(value: Any, tp: Any, name: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, name)
            except ConfigError:
                pass
        raise ConfigError(f"{name}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{name}: must be one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping, got {value!r}")
        return _build(tp, value, name)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-5 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp} for {name}")


def _type_name(tp: Any) -> str:
    names = []
    for a in typing.get_args(tp):
        if typing.get_origin(a) is Literal:
            names.extend(repr(v) for v in typing.get_args(a))
        elif a is not type(None):
            names.append(getattr(a, "__name__", repr(a)))
    return " or ".join(names)


def _build(cls: type, values: dict, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(f"{where}{unknown[0]}: unknown setting (known: {', '.join(sorted(known))})")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in values.items()}
    return cls(**kwargs)


def _set_path(d: dict, dotted: str, raw: str) -> None:
    keys = dotted.split(".")
    for key in keys[:-1]:
        d = d.setdefault(key, {})
        if not isinstance(d, dict):
            raise ConfigError(f"{dotted}: {key} is not a section")
    d[keys[-1]] = yaml.safe_load(raw)


def load_config(path: str | Path | None = None, *, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read a YAML file (optional), apply ``section.field=value`` overrides, build and validate."""
    values: dict = {}
    if path is not None:
        try:
            values = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"config file {path}: cannot read it ({exc})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"config file {path}: expected a mapping of sections")
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected section.field=value")
        key, raw = item.split("=", 1)
        _set_path(values, key.strip(), raw)
    return _build(RunConfig, values).validate()


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
