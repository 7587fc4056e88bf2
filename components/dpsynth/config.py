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
    # Public data (dp-GAN of Zhang et al.: warm start, adaptive clipping bounds), at most one of: a separate
    # source (public_source: "sklearn:digits", offline, or any source `dpsynth data import` reads), the records
    # of a named split, or a keyed-hash fraction of the sensitive data (HMAC u in [heldout_fraction,
    # heldout_fraction + public_fraction)) — the last only with public_fraction_unprotected: true, which
    # acknowledges that those records are unprotected (the audit and the release say so). Public records are
    # never in a training shard. See dpsynth.data.public.
    public_fraction: float = 0.0
    public_split: str | None = None
    public_source: str | None = None
    public_fraction_unprotected: bool = False

    def validate(self) -> None:
        _require(bool(self.uri), "data.uri", "must name a dataset")
        _require(0 <= self.heldout_fraction < 1, "data.heldout_fraction", f"must be in [0, 1), got {self.heldout_fraction}")
        _require(0 <= self.public_fraction < 1, "data.public_fraction", f"must be in [0, 1), got {self.public_fraction}")
        _require(self.heldout_fraction + self.public_fraction < 1, "data.public_fraction",
                 f"held-out plus public fractions must stay below 1, got {self.heldout_fraction} + {self.public_fraction}")
        _require(self.public_split is None or self.public_fraction == 0, "data.public_split",
                 "declare public data by public_split or by public_fraction, not both")
        _require(self.public_source is None or (self.public_split is None and self.public_fraction == 0),
                 "data.public_source", "declare public data by one of public_source, public_split, public_fraction")
        _require(self.public_source is None or self.public_source != self.uri, "data.public_source",
                 "is data.uri: the sensitive dataset is not a public source")
        _require(self.public_fraction == 0 or self.public_fraction_unprotected, "data.public_fraction",
                 f"{self.public_fraction} labels a slice of the sensitive dataset 'public' and trains on it without "
                 "privacy; use a separate source (data.public_source, e.g. sklearn:digits), or acknowledge that "
                 "these records are unprotected with data.public_fraction_unprotected=true")
        _require(self.public_split is None or self.public_split != self.train_split, "data.public_split",
                 f"{self.public_split!r} is also data.train_split: public records cannot be private training data")
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
    # The mechanism's noise, masks and shard/client choice are always seeded from OS entropy
    # (dpsynth.privacy.randomness). secure_mode also reseeds from os.urandom before every draw and
    # sums 4 Gaussian draws / 2 against floating-point attacks (as Opacus' secure_mode).
    secure_mode: bool = False

    def validate(self) -> None:
        _require(self.epsilon > 0, "privacy.epsilon", f"must be > 0, got {self.epsilon}")
        _require(0 < self.delta < 1, "privacy.delta", f"must be in (0, 1), got {self.delta}")
        _require(self.noise_multiplier is None or self.noise_multiplier > 0, "privacy.noise_multiplier", "must be > 0")
        _require(self.max_grad_norm > 0, "privacy.max_grad_norm", f"must be > 0, got {self.max_grad_norm}")


@dataclass(frozen=True)
class TrainConfig:
    # dpgan: Bie et al.; gswgan / dpac: GS-WGAN and DP-GAN-DPAC (sections `gswgan`, `dpac`);
    # zhang: dp-GAN of Zhang, Ji & Wang (section `zhang`)
    method: Literal["dpgan", "gswgan", "dpac", "zhang", "gswgan_federated"] = "dpgan"
    steps: int = 2000  # private steps T, one event each (what a step is per method: methods/loop.py); fewer at the ε budget
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
    g_warp: bool = False  # DPGAN's G ends with a fixed warp of its image by z[:, :6] (dcgan.Generator(warp=True))
    grad_sample_mode: Literal["hooks", "ew", "ghost", "ghost_two_pass"] = "ghost"
    seed: int = 0  # initialisation and latents / fake samples only; never the mechanism's randomness
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
    checkpoint_every: int = 500  # private steps (train.steps' unit) between checkpoints; 0 disables
    sample_every: int = 500  # steps between sample grids written to dir/grids (sensitive zone; never to MLflow)
    log_every: int = 50  # private steps between metric logs
    resume: bool = True  # continue from the last checkpoint in `dir` if there is one

    def validate(self) -> None:
        for name in ("checkpoint_every", "sample_every", "log_every"):
            _require(getattr(self, name) >= 0, f"output.{name}", "must be >= 0")


@dataclass(frozen=True)
class TrackingConfig:
    uri: str | None = None  # None: sqlite database in the output dir
    experiment: str | None = None  # None: one experiment per dataset, named after it
    enabled: bool = True
    # Where a new experiment keeps its artifacts, e.g. s3://bucket/mlflow (endpoint: MLFLOW_S3_ENDPOINT_URL).
    # None: beside a SQLite store, or the tracking server's default artifact root.
    artifact_location: str | None = None


@dataclass(frozen=True)
class LedgerConfig:
    """The lifetime privacy-budget ledger (``dpsynth.privacy.ledger``): every private training attempt is charged."""

    # SQLAlchemy URL. None: $DPSYNTH_LEDGER_URL, else a SQLite ledger.db beside the run's SQLite MLflow
    # store, else beside a local run directory (standalone `dpsynth train`: outputs/ledger.db); required
    # (or the variable) for a remote run directory.
    url: str | None = None
    # The population (the people whose records the dataset holds, across its versions): its lifetime
    # budget is charged. Required for training; never derived from a file name (a rename would reset it).
    population_id: str | None = None
    # An open reservation whose attempt has not written a checkpoint (its heartbeat) for this long is
    # settled at its whole amount by the next attempt on the population.
    stale_after_hours: float = 48.0

    def validate(self) -> None:
        _require(self.url is None or bool(self.url), "ledger.url", "must be a SQLAlchemy URL or null")
        _require(self.population_id is None or 0 < len(self.population_id.strip()) <= 200, "ledger.population_id",
                 "must be a non-empty string of at most 200 characters, or null")
        _require(self.stale_after_hours > 0, "ledger.stale_after_hours", f"must be > 0, got {self.stale_after_hours}")


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
class WarmstartConfig:
    """How ``dpsynth warmstart`` runs the per-shard warm starts it finds not yet done (Airflow and
    KFP fan them out as ``dpsynth warmstart --shard K`` tasks instead)."""

    workers: int = 1  # local processes; each gets cpu_count // workers torch threads

    def validate(self) -> None:
        _require(self.workers >= 1, "warmstart.workers", f"must be >= 1, got {self.workers}")


@dataclass(frozen=True)
class WarmupConfig:
    """The private warm-up before training (``dpsynth.methods.warmup``; Li et al. 2025): one Gaussian
    release of every class's mean image (ε composed with training in the same trace), then the
    generator fitted to deformations of those central images (post-processing, free)."""

    central_images: bool = False
    noise_multiplier: float = 8.0  # σ of the release: noise std σ·clip on every class sum
    clip: float = 10.0  # C: L2 bound of a record's [image in [0, 1], count] contribution
    styles: int = 0  # s > 0: a second release, the means of s × s style groups per class (0: none)
    styles_noise_multiplier: float = 1.0  # σ of the style release (noise std σ·clip on every group sum)
    variations: int = 0  # r > 0: a third release, each class's r main directions of variation (0: none)
    variations_noise_multiplier: float = 2.0  # σ of that release (noise std σ·variations_clip² per entry)
    variations_clip: float = 5.0  # L2 bound of a record's residual (in [0, 1] pixel units) around its image
    steps: int = 800  # generator regression steps on the deformed central images (no data access)
    batch_size: int = 128
    lr: float = 1e-3

    def validate(self) -> None:
        _require(self.noise_multiplier > 0, "warmup.noise_multiplier", f"must be > 0, got {self.noise_multiplier}")
        _require(self.clip > 0, "warmup.clip", f"must be > 0, got {self.clip}")
        _require(0 <= self.styles <= 6, "warmup.styles", f"must be between 0 and 6, got {self.styles}")
        _require(self.styles_noise_multiplier > 0, "warmup.styles_noise_multiplier",
                 f"must be > 0, got {self.styles_noise_multiplier}")
        _require(0 <= self.variations <= 32, "warmup.variations", f"must be between 0 and 32, got {self.variations}")
        _require(self.variations_noise_multiplier > 0, "warmup.variations_noise_multiplier",
                 f"must be > 0, got {self.variations_noise_multiplier}")
        _require(self.variations_clip > 0, "warmup.variations_clip", f"must be > 0, got {self.variations_clip}")
        _require(self.steps >= 0, "warmup.steps", f"must be >= 0, got {self.steps}")
        _require(self.batch_size >= 1, "warmup.batch_size", f"must be >= 1, got {self.batch_size}")
        _require(self.lr > 0, "warmup.lr", f"must be > 0, got {self.lr}")


@dataclass(frozen=True)
class GSWGANConfig:
    """GS-WGAN (Chen, Orekondy & Fritz 2020) and the GS-WGAN part of DPAC; defaults are the paper's.

    ``train.steps`` is T (private generator iterations), ``train.seed`` and ``train.device``
    apply; ``privacy.max_grad_norm`` is the clip bound C and ``privacy.noise_multiplier`` the
    per-release σ (noise std / C of each sanitized ∂L_G/∂G(z_i)). The ``train`` section's batch
    size, widths, learning rates and n_d are DPGAN's and are not used here.
    """

    warmstart_iterations: int = 2000  # T_w: non-private iterations per shard (0: D_k starts fresh)
    n_dis: int = 5  # critic steps of D_k per generator iteration
    batch_size: int = 32  # B: real and fake records per critic step, sanitized samples per G step
    gp_weight: float = 10.0  # WGAN-GP λ
    drift_weight: float = 0.001  # ε_drift · E[D(x)²] (the authors' L_epsilon)
    lr_d: float = 1e-4
    lr_g: float = 1e-4
    adam_beta1: float = 0.5
    adam_beta2: float = 0.99
    d_width: int = 64  # DCGAN discriminator, spectral norm, label projection
    g_width: int = 64  # ResNet generator
    latent_dim: int = 10
    ema_decay: float = 0.999  # the released generator is an EMA of G's weights; 0: G itself

    def validate(self) -> None:
        for name in ("n_dis", "batch_size", "d_width", "g_width", "latent_dim"):
            _require(getattr(self, name) >= 1, f"gswgan.{name}", f"must be >= 1, got {getattr(self, name)}")
        _require(self.warmstart_iterations >= 0, "gswgan.warmstart_iterations", "must be >= 0")
        for name in ("gp_weight", "drift_weight"):
            _require(getattr(self, name) >= 0, f"gswgan.{name}", "must be >= 0")
        for name in ("lr_d", "lr_g"):
            _require(getattr(self, name) > 0, f"gswgan.{name}", "must be > 0")
        for name in ("adam_beta1", "adam_beta2", "ema_decay"):
            _require(0 <= getattr(self, name) < 1, f"gswgan.{name}", "must be in [0, 1)")


@dataclass(frozen=True)
class DPACConfig:
    """DP-GAN-DPAC (Chen et al. 2023): GS-WGAN plus a fresh auxiliary classifier per iteration from t_c."""

    start_iteration: int = 6000  # t_c: first generator iteration (0-based) that uses the classifier
    beta: float = 0.8  # L_G = β·L_D + (1 − β)·L_C, combined per sample before sanitization
    n_f: int = 10  # classifier steps on one fixed class-balanced fake batch
    n_r: int = 10  # then classifier steps on real batches of the same shard
    lr_c: float = 1e-4
    c_width: int = 64  # DCGAN classifier

    def validate(self) -> None:
        _require(self.start_iteration >= 0, "dpac.start_iteration", "must be >= 0")
        _require(0 <= self.beta <= 1, "dpac.beta", f"must be in [0, 1], got {self.beta}")
        for name in ("n_f", "n_r"):
            _require(getattr(self, name) >= 0, f"dpac.{name}", "must be >= 0")
        _require(self.lr_c > 0, "dpac.lr_c", "must be > 0")
        _require(self.c_width >= 1, "dpac.c_width", "must be >= 1")


@dataclass(frozen=True)
class ZhangConfig:
    """dp-GAN of Zhang, Ji & Wang (seed 004): WGAN-GP with a DP critic, parameter grouping,
    adaptive clipping bounds and a warm start, both from public data (``data.public_*``)."""

    n_critic: int = 4  # private critic steps per generator step
    gp_weight: float = 10.0  # λ of the gradient penalty
    # global: one group; weight_bias: weights vs biases; per_layer: one group per layer;
    # clustering: Algorithm 2 on per-tensor bounds from public data, into num_groups groups
    grouping: Literal["global", "weight_bias", "per_layer", "clustering"] = "clustering"
    num_groups: int = 5  # k for clustering
    adaptive_clipping: bool = True  # bounds = mean per-example group norm on a public batch
    update_every: int = 1  # critic steps between bound (and clustering) updates
    public_batch_size: int = 64  # m_pub
    warm_start_iterations: int = 300  # t_warm generator iterations on public data; 0: no warm start
    lr: float = 2e-3  # Adam α of both networks (Table 1, MNIST)
    lr_g: float | None = None  # the generator's Adam α when it differs (a slow G keeps a private warm-up)
    adam_beta1: float = 0.5
    adam_beta2: float = 0.9

    def validate(self) -> None:
        _require(self.n_critic >= 1, "zhang.n_critic", f"must be >= 1, got {self.n_critic}")
        _require(self.gp_weight >= 0, "zhang.gp_weight", f"must be >= 0, got {self.gp_weight}")
        _require(self.num_groups >= 1, "zhang.num_groups", f"must be >= 1, got {self.num_groups}")
        _require(self.update_every >= 1, "zhang.update_every", f"must be >= 1, got {self.update_every}")
        _require(self.public_batch_size >= 1, "zhang.public_batch_size", f"must be >= 1, got {self.public_batch_size}")
        _require(self.warm_start_iterations >= 0, "zhang.warm_start_iterations", "must be >= 0")
        _require(self.lr > 0, "zhang.lr", f"must be > 0, got {self.lr}")
        _require(self.lr_g is None or self.lr_g > 0, "zhang.lr_g", f"must be > 0, got {self.lr_g}")
        for name in ("adam_beta1", "adam_beta2"):
            _require(0 <= getattr(self, name) < 1, f"zhang.{name}", "must be in [0, 1)")


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
    """``dpsynth evaluate`` (see dpsynth.evaluation). ``suite``: quick runs ``classifier`` only;
    full runs every classifier of GS-WGAN's Tables A1–A2 (minutes on CPU)."""

    # The headline gen2real classifier (trained on synthetic data, tested on real reference data): the
    # CNN of the DPImageBench protocol. The quick suite runs it and logistic regression (a fast extra).
    classifier: Literal["logreg", "cnn", "mlp", "random_forest", "gaussian_nb", "bernoulli_nb", "linear_svc",
                        "decision_tree", "lda", "adaboost", "bagging", "gbm", "xgboost"] = "cnn"
    suite: Literal["quick", "full"] = "quick"
    max_iter: int = 200  # logreg: solver iterations
    epochs: int = 5  # cnn / mlp: passes over the synthetic data (the best epoch is chosen on held-out synthetic data)
    feature_steps: int = 150  # the reference CNN (fid_classifier, IS, JS): batches of 64 real reference records
    validation_fraction: float = 0.1  # synthetic records held out for model selection (never real data)
    max_train_records: int | None = 20000  # cap on synthetic records a classifier trains on; None: all
    # Real data the metrics compare with. None: the partition's held-out records (never trained on).
    reference_uri: str | None = None
    # What reference_uri is: public or heldout (never trained on) make the metrics releasable; sensitive
    # (e.g. training records) labels them internal. Must be heldout when reference_uri is None.
    reference_kind: Literal["heldout", "public", "sensitive"] = "heldout"
    # A TorchScript pytorch-fid Inception-v3 pool3 extractor (see dpsynth.evaluation.fid); None or
    # missing file: the Fréchet distance is computed on the reference classifier's features as fid_classifier.
    inception_weights: str | None = None
    mia: bool = True  # membership inference (GAN-Leaks, black box); reads training records: internal
    mia_records: int = 500  # training (held-in) and held-out records each, at most
    mia_generated: int = 5000  # generated samples the attack compares each record with
    # ε-vs-metric curve over the generator snapshots the train manifest lists (role generator_snapshot)
    curve_samples: int = 2000  # generated samples per snapshot; 0: no curve
    seed: int = 0

    def validate(self) -> None:
        _require(self.max_iter >= 1, "evaluate.max_iter", f"must be >= 1, got {self.max_iter}")
        _require(self.epochs >= 1, "evaluate.epochs", f"must be >= 1, got {self.epochs}")
        _require(self.feature_steps >= 1, "evaluate.feature_steps", f"must be >= 1, got {self.feature_steps}")
        _require(0 < self.validation_fraction < 1, "evaluate.validation_fraction",
                 f"must be in (0, 1), got {self.validation_fraction}")
        _require(self.max_train_records is None or self.max_train_records >= 10, "evaluate.max_train_records",
                 "must be >= 10 (or null for no cap)")
        _require(self.reference_uri is not None or self.reference_kind == "heldout", "evaluate.reference_kind",
                 f"must be 'heldout' when evaluate.reference_uri is unset (the partition's held-out records), "
                 f"got {self.reference_kind!r}")
        _require(self.mia_records >= 2, "evaluate.mia_records", f"must be >= 2, got {self.mia_records}")
        _require(self.mia_generated >= 1, "evaluate.mia_generated", f"must be >= 1, got {self.mia_generated}")
        _require(self.curve_samples >= 0, "evaluate.curve_samples", f"must be >= 0, got {self.curve_samples}")


@dataclass(frozen=True)
class AuditConfig:
    """``dpsynth audit``'s optional empirical step (``dpsynth.privacy.empirical``): an audit run of the
    method with canaries on a public stand-in, ε_lower at ``confidence``; the audit fails when ε_lower
    exceeds the accounted ε. off: skipped; quick: the first ``quick_steps`` steps; full: every step."""

    empirical: Literal["off", "quick", "full"] = "off"
    canaries: int = 1000  # m
    confidence: float = 0.95
    quick_steps: int = 100

    def validate(self) -> None:
        _require(self.canaries >= 2, "audit.canaries", f"must be >= 2, got {self.canaries}")
        _require(0 < self.confidence < 1, "audit.confidence", f"must be in (0, 1), got {self.confidence}")
        _require(self.quick_steps >= 1, "audit.quick_steps", f"must be >= 1, got {self.quick_steps}")


@dataclass(frozen=True)
class PipelineConfig:
    run_dir: str | None = None  # root URI (local or s3://) of one pipeline run: run_dir/sensitive, run_dir/release


@dataclass(frozen=True)
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    zhang: ZhangConfig = field(default_factory=ZhangConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    warmstart: WarmstartConfig = field(default_factory=WarmstartConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    gswgan: GSWGANConfig = field(default_factory=GSWGANConfig)
    dpac: DPACConfig = field(default_factory=DPACConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)

    def validate(self) -> "RunConfig":
        for section in dataclasses.fields(self):
            value = getattr(self, section.name)
            if hasattr(value, "validate"):
                value.validate()
        # refused before training spends anything, not at the audit
        from dpsynth.methods.registry import empirical_audit_methods  # the registry's Method.empirical_audit

        audited = empirical_audit_methods()
        _require(self.audit.empirical == "off" or self.train.method in audited, "audit.empirical",
                 f"the empirical audit supports train.method in {list(audited)}, not "
                 f"{self.train.method!r} (yet); set audit.empirical=off")
        method, dcgan = self.train.method, self.train.method in ("dpgan", "zhang")  # dcgan.Generator's methods
        _require(not self.train.g_warp or dcgan, "train.g_warp",
                 f"only DPGAN's and dp-GAN's generator (dcgan.Generator) warps, not train.method={method!r}")
        _require(not self.train.g_warp or self.train.latent_dim >= 6, "train.g_warp",
                 f"the warp reads z[:, :6]: train.latent_dim must be >= 6, got {self.train.latent_dim}")
        w = self.warmup
        _require(not w.central_images or method != "gswgan_federated", "warmup.central_images",
                 "the federated GS-WGAN server holds no records to release; set warmup.central_images=false")
        _require(not (w.central_images and w.styles) or dcgan, "warmup.styles",
                 f"the style release needs a generator with style slots (dcgan.Generator: dpgan, zhang), not "
                 f"train.method={method!r}; set warmup.styles=0")
        latent, where = ((self.train.latent_dim, "train.latent_dim") if dcgan
                         else (self.gswgan.latent_dim, "gswgan.latent_dim"))
        _require(not (w.central_images and w.variations) or latent >= 7 + w.variations,
                 "warmup.variations", f"{w.variations} directions need {where} >= {7 + w.variations} "
                 f"(z[:, 7:7 + r] weighs them), got {latent}")
        _require(not w.central_images or latent >= 6, "warmup.central_images",
                 f"the warm-up's deformations read z[:, :6]: {where} must be >= 6, got {latent}")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def fingerprint(
        self, *, exclude: tuple[str, ...] = ("output", "tracking", "ledger", "warmstart", "sample", "evaluate", "audit",
                                  "pipeline")
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
        if value is False and "off" in typing.get_args(tp):  # YAML 1.1 reads off (audit.empirical=off) as false
            value = "off"
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
