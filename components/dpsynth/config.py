"""One typed, validated configuration per run: frozen pydantic dataclasses, loaded from YAML plus
``--set section.field=value`` overrides, checked at the edge with errors that name the field.

Each setting is declared once, here: its type, its bounds (``Field(ge=…)``) and its description.
:func:`json_schema` exports them as one JSON Schema (``dpsynth config schema``), from which the Airflow
trigger form, the chart's ``values.schema.json`` and the KFP pipeline's inputs are built.

>>> cfg = load_config(overrides=["privacy.epsilon=3", "train.steps=200"])
>>> cfg.privacy.epsilon, cfg.train.steps
(3.0, 200)
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Callable, Literal

import yaml
from pydantic import ConfigDict, Field, StrictBool, StrictFloat, StrictInt, TypeAdapter, ValidationError
from pydantic import ValidationInfo, field_validator, model_validator
from pydantic.dataclasses import dataclass

from dpsynth.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATASET = str(REPO_ROOT / "data" / "mnist")
# Unknown settings are refused; NaN and infinities are no setting's value. The validators are built at first
# use, not on import (`dpsynth --help` imports this module).
SECTION = ConfigDict(extra="forbid", allow_inf_nan=False, defer_build=True)
NOT_BLANK = r"\S"  # a string's pattern: at least one character that is not white space


class _Loader(yaml.SafeLoader):
    """PyYAML's YAML 1.1, except that a number with an exponent and no dot (1e-5, as YAML 1.2 and JSON write
    it) is a number, not a string."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                              re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
                              list("-+0123456789."))

# The scalar types of the settings: YAML integers, numbers and booleans as written, never coerced from
# one another (true is not 1, 2.5 is no integer, "2" is a string); an integer is a number too.
Int = StrictInt
Float = StrictFloat
Bool = StrictBool


# train.method: the methods' names, each with its one line (`dpsynth train --help`), in the method registry's order.
# Each method file declares the rest (dpsynth.methods.<name>'s METHOD: trainer, mechanism, n_D, rules), and the
# registry (dpsynth.methods.registry) collects them and refuses to import unless it finds these names. They stay
# here because the configuration is the ground floor and imports no method (nor torch): the schema's enum (the
# Airflow form, the KFP inputs) and --help need the names alone.
METHODS = {
    "dpgan": "DPGAN of Bie et al., 'Private GANs, Revisited': DP-SGD discriminator, Poisson sampling",
    "gswgan": "GS-WGAN (Chen et al. 2020): sanitized generator gradients, K pre-trained shard critics",
    "dpac": "DP-GAN-DPAC (Chen et al. 2023): GS-WGAN plus a dual-purpose auxiliary classifier",
    "zhang": "dp-GAN (Zhang et al.): WGAN-GP with a DP critic, parameter grouping, public pre-training",
    "gswgan_federated": "federated GS-WGAN: server and K clients, the ranks of one torchrun job (gloo)",
    "private-evolution": "Private Evolution (Lin et al. 2024) on the public prior (Sim-PE): noisy votes for "
                         "rendered figures",
}
# train.method: auto picks the method from the data's public schema before anything private runs (the rule:
# dpsynth.methods.registry.for_schema; the stages resolve it, and store and log the method it picked)
AUTO = "auto"
MethodName = Literal[tuple(METHODS) + (AUTO,)]


def _require(ok: bool, name: str, message: str) -> None:
    """A check across settings (inside a model validator); the message names the setting to change."""
    if not ok:
        raise ValueError(f"{name}: {message}")


def _no_default(schema: dict) -> None:
    schema.pop("default", None)  # a path in this checkout: no default to export


@dataclass(frozen=True, config=SECTION)
class DataConfig:
    """The sensitive dataset, its held-out records and any public data."""

    uri: str = Field(DEFAULT_DATASET, min_length=1, json_schema_extra=_no_default,
                     description="The sensitive dataset: canonical Parquet (local path or s3://), or any source "
                                 "`dpsynth data import` reads. Default: the bundled MNIST test set.")
    num_classes: Int | None = Field(
        None, ge=2,
        description="Number of classes: public, set from what is known of the population (10 for MNIST), never "
                    "from the data. Required to train: the label set shapes every release (the generator's class "
                    "embedding, the warm-up's per-class releases), and max(label) + 1 of the data would change "
                    "with the only record of the top class. Every label must lie in [0, num_classes - 1].")
    train_split: str | None = Field(None, description="Train on the records of this split only; null: every record "
                                                      "is sensitive training data.")
    heldout_fraction: Float = Field(
        0.1, ge=0, lt=1,
        description="The pipeline holds out the records whose keyed hash (see partition.key) falls below this "
                    "fraction; `evaluate` tests on them and they are never trained on. 0: nothing held out.")
    # Public data (dp-GAN of Zhang et al.: pre-training, adaptive clipping bounds), at most one of the three below.
    # Public records are never in a training shard. See dpsynth.data.public.
    public_fraction: Float = Field(
        0.0, ge=0, lt=1,
        description="Public data as a keyed-hash fraction of the sensitive data (HMAC u in [heldout_fraction, "
                    "heldout_fraction + public_fraction)); only with public_fraction_unprotected: true, which "
                    "acknowledges that those records are unprotected (the audit and the release say so).")
    public_split: str | None = Field(None, description="Public data: the records of this split.")
    public_source: str | None = Field(None, description="Public data: a separate source, e.g. sklearn:digits "
                                                        "(offline), or any source `dpsynth data import` reads.")
    public_fraction_unprotected: Bool = Field(
        False, description="Acknowledges that the records public_fraction labels public are unprotected.")

    @model_validator(mode="after")
    def _public_data(self) -> DataConfig:
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
        return self

    @property
    def name(self) -> str:
        """The dataset's short name: the last part of ``uri`` without its suffix ("dataset" when that is empty).
        It names the MLflow experiment of its runs (``dpsynth/<name>``, :func:`dpsynth.tracking.experiment_name`)."""
        return Path(str(self.uri).rstrip("/")).stem or "dataset"


@dataclass(frozen=True, config=SECTION)
class PrivacyConfig:
    """The (ε, δ) target of the training run and how its mechanism is accounted."""

    epsilon: Float = Field(10.0, gt=0, description="Target ε of the run (training and any private warm-up).")
    delta: Float = Field(1e-5, gt=0, lt=1, description="Target δ; keep it below 1/n for n training records.")
    accountant: Literal["rdp", "prv"] = Field("rdp", description="The accountant that calibrates the noise "
                                                                 "(the audit reports both).")
    noise_multiplier: Float | None = Field(None, gt=0, description="σ of the private steps; null: calibrated so "
                                                                   "that train.steps spends exactly ≤ epsilon.")
    max_grad_norm: Float = Field(1.0, gt=0, description="C: the per-sample clip bound.")
    accounting: Literal["sound", "as_published"] = Field(
        "sound", description="sound: our accounting (docs/privacy.md). as_published: reproduce a paper's own "
                             "(unsound) account; such a run is marked unsound and the audit never passes it.")
    secure_mode: Bool = Field(
        False, description="The mechanism's noise, masks and shard/client choice are always seeded from OS "
                           "entropy (dpsynth.mechanisms.randomness). secure_mode also reseeds from os.urandom before "
                           "every draw and sums 4 Gaussian draws / 2 against floating-point attacks (as Opacus' "
                           "secure_mode).")


@dataclass(frozen=True, config=SECTION)
class TrainConfig:
    """The training method and DPGAN's settings (Bie et al.); ``train.steps``, ``seed`` and ``device`` apply to
    every method."""

    method: MethodName = Field(
        "dpgan", description="dpgan: Bie et al.; gswgan / dpac: GS-WGAN and DP-GAN-DPAC (one pre-trained "
                             "discriminator per shard; sections gswgan, dpac); gswgan_federated: GS-WGAN with each "
                             "shard a client process; zhang: dp-GAN of Zhang, Ji & Wang (section zhang; needs "
                             "public data, data.public_*); private-evolution: Private Evolution on the public prior "
                             "(section evolution; docs/prior.md); auto: picked from the data's public schema before "
                             "anything private runs, colour (3 channels) private-evolution, else dpgan (the run's "
                             "stored configuration and its MLflow parameters show the method picked).")
    steps: Int = Field(2000, ge=1, description="Private steps T, one event each (what a step is per method: "
                                               "training/loop.py); fewer at the ε budget.")
    batch_size: Int = Field(128, ge=1, description="Expected Poisson batch size B; q = B / n.")
    physical_batch_size: Int | None = Field(None, ge=1, description="Memory cap per forward/backward; null: no cap.")
    n_d: Annotated[Int, Field(ge=1)] | Literal["adaptive"] | None = Field(
        None, description="Discriminator (critic) steps per generator step, in every method: Bie et al.'s n_D "
                          "(dpgan), GS-WGAN's n_dis (gswgan, dpac, gswgan_federated), dp-GAN's n_critic (zhang). "
                          "null: the method's default (dpgan: adaptive; gswgan, dpac, gswgan_federated: 5; zhang: 4). "
                          '"adaptive" (dpgan only): grows from 1 while the discriminator\'s accuracy on fakes stays '
                          "above n_d_threshold.")
    n_d_threshold: Float = Field(0.6, ge=0, le=1, description="Adaptive n_d: the discriminator's accuracy on fakes "
                                                              "above which n_d grows.")
    n_d_beta: Float = Field(0.99, gt=0, lt=1, description="Adaptive n_d: the decay of that accuracy's moving average.")
    lr_d: Float = Field(2e-4, gt=0)
    lr_g: Float = Field(2e-4, gt=0)
    adam_beta1: Float = Field(0.5, ge=0, lt=1)
    adam_beta2: Float = Field(0.999, ge=0, lt=1)
    d_width: Int = Field(128, ge=1)
    g_width: Int = Field(128, ge=1)
    latent_dim: Int = Field(100, ge=1)
    g_warp: Bool = Field(False, description="The DCGAN generator (DPGAN's, dp-GAN's, GS-WGAN's with "
                                            "gswgan.generator=dcgan) ends with a fixed warp of its image by "
                                            "z[:, :6] (dcgan.Generator(warp=True)).")
    g_contrast: Float = Field(0.0, ge=0, description="s > 0: the DCGAN generator ends (after the warp) with a "
                                                   "fixed contrast layer x ↦ tanh(s·x) / tanh(s), which pushes grey "
                                                   "pixels towards ink or background; 0: none.")
    g_tone: Bool = Field(False, description="The DCGAN generator ends (after the warp and any contrast) with a fixed "
                                            "monotone map of its pixel values, set after the private warm-up's fit so "
                                            "that G's pixels have the intensity histogram the warm-up released "
                                            "(post-processing: no privacy spent). On single-channel (grey) images "
                                            "only: colour images keep G's own values. Needs warmup.central_images "
                                            "and warmup.intensity_noise_multiplier.")
    grad_sample_mode: Literal["hooks", "ew", "ghost", "ghost_two_pass"] = Field(
        "ghost", description="How per-sample gradients are clipped: Opacus hooks, ew (expanded weights) or ghost "
                             "clipping.")
    seed: Int = Field(0, ge=0, description="Initialisation and latents / fake samples only; never the mechanism's "
                                           "randomness.")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Where the orchestrators run the train stage: nodes × gpus_per_node ranks, one GPU each (a Kubeflow Trainer
    # TrainJob when > 1; docs/distributed.md). Not in any fingerprint (LAUNCH_FIELDS): results do not depend on them.
    nodes: Int = Field(1, ge=1, description="Nodes the orchestrators run the train stage on (a Kubeflow Trainer "
                                            "TrainJob when nodes × gpus_per_node > 1).")
    gpus_per_node: Int = Field(1, ge=1, description="Ranks per node, one GPU each (torchrun's nproc-per-node).")


@dataclass(frozen=True, config=SECTION)
class OutputConfig:
    """Where ``dpsynth train`` writes, and how often."""

    dir: str = "outputs/run"
    checkpoint_every: Int = Field(500, ge=0, description="Private steps (train.steps' unit) between checkpoints; "
                                                         "0 disables.")
    sample_every: Int = Field(500, ge=0, description="Steps between sample grids written to dir/grids (sensitive "
                                                     "zone; never to MLflow).")
    log_every: Int = Field(50, ge=0, description="Private steps between metric logs.")
    resume: Bool = Field(True, description="Continue from the last checkpoint in dir if there is one.")


@dataclass(frozen=True, config=SECTION)
class TrackingConfig:
    """MLflow tracking."""

    uri: str | None = Field(None, description="The MLflow tracking URI; null: a SQLite database in the output dir.")
    experiment: str | None = Field(None, description="null: one experiment per dataset, named after it.")
    enabled: Bool = True
    artifact_location: str | None = Field(
        None, description="Where a new experiment keeps its artifacts, e.g. s3://bucket/mlflow (endpoint: "
                          "MLFLOW_S3_ENDPOINT_URL). null: beside a SQLite store, or the tracking server's default "
                          "artifact root.")


@dataclass(frozen=True, config=SECTION)
class LedgerConfig:
    """The lifetime privacy-budget ledger (``dpsynth.ledger.store``): every private training attempt is charged."""

    url: str | None = Field(
        None, min_length=1,
        description="SQLAlchemy URL. null: $DPSYNTH_LEDGER_URL, else a SQLite ledger.db beside the run's SQLite "
                    "MLflow store, else beside a local run directory (standalone `dpsynth train`: "
                    "outputs/ledger.db); required (or the variable) for a remote run directory.")
    population_id: str | None = Field(
        None, min_length=1, max_length=200, pattern=NOT_BLANK,
        description="The population (the people whose records the dataset holds, across its versions): its "
                    "lifetime budget is charged, which an operator sets beforehand (`dpsynth ledger set-budget "
                    "POPULATION --epsilon E --delta D --reason TEXT`; there is none by default). Required for "
                    "training; never derived from a file name (a rename would reset it).")
    stale_after_hours: Float = Field(
        48.0, gt=0, description="An open reservation whose attempt has not written a checkpoint (its heartbeat) for "
                                "this long is settled at its whole amount by the next attempt on the population.")
    window: Int | None = Field(
        None, ge=1,
        description="Retraining on privacy blocks (data imported with `dpsynth data import --versioned`; "
                    "docs/privacy.md, \"Privacy blocks\"): a run reads the last WINDOW blocks (null: every block), "
                    "less those whose budget left cannot pay its (ε, δ), chosen before anything is read. The "
                    "population's budget is each block's lifetime budget.")


@dataclass(frozen=True, config=SECTION)
class PartitionConfig:
    """How `dpsynth partition` assigns records: HMAC-SHA256(key, record_id), so a record's shard
    (and whether it is held out) depends on its id alone, never on the other records."""

    num_shards: Int = Field(1, ge=1, description="K training shards (DPGAN trains on their union; GS-WGAN one D "
                                                 "per shard).")
    key: str | None = Field(
        None, min_length=1,
        description="A secret the operator sets, fixed per population (required by `dpsynth partition`; no "
                    "default). Whoever knows it knows which shard each record joins and whether it is held out, so "
                    "for a real population keep it secret (it is logged only as a digest). Changing it reassigns "
                    "every record, so records held out under one key would be trained on under another. The "
                    "shipped configs set dpsynth-partition-v1: the bundled MNIST demo's key, which is public.")


@dataclass(frozen=True, config=SECTION)
class PretrainConfig:
    """How ``dpsynth pretrain`` runs the per-shard pre-training runs it finds not yet done (Airflow and
    KFP fan them out as ``dpsynth pretrain --shard K`` tasks instead)."""

    workers: Int = Field(1, ge=1, description="Local processes; each gets cpu_count // workers torch threads.")


@dataclass(frozen=True, config=SECTION)
class WarmupConfig:
    """The private warm-up before training (``dpsynth.warmup``; Li et al. 2025): one Gaussian
    release of every class's mean image (ε composed with training in the same trace), then the
    generator fitted to deformations of those central images (post-processing, free)."""

    central_images: Bool = False
    intensity_noise_multiplier: Float | None = Field(
        None, gt=0, description="σ_h > 0: a first release, the histogram of pixel intensities (each record's "
                                "normalised 16-bin histogram, L2 ≤ 1, noise std σ_h per bin); the warm-up's images are "
                                "cleaned (dark background, brightest pixel white) only when it is two-tone ink on a "
                                "dark background. null: no such release, always cleaned (the digit recipe).")
    noise_multiplier: Float = Field(8.0, gt=0, description="σ of the release: noise std σ·clip on every class sum.")
    clip: Float = Field(10.0, gt=0, description="C: L2 bound of a record's [image in [0, 1], count] contribution.")
    styles: Int = Field(0, ge=0, le=6, description="s > 0: a second release, the means of s × s style groups per "
                                                   "class (0: none).")
    styles_along: Literal["deformations", "variations"] = Field(
        "deformations", description="The style groups' public templates: deformations, each class mean sheared and "
                                    "thickened or thinned on the s × s grid (the digit recipe); variations, each "
                                    "class mean moved by −1 … +1 (s levels each) along the two released "
                                    "directions of variation that change its shape most (each less its smooth "
                                    "part: brightness, colour, gradients), the style release then following "
                                    "the variation release, whose directions are taken around the class means (needs "
                                    "warmup.variations >= 2).")
    styles_noise_multiplier: Float = Field(1.0, gt=0, description="σ of the style release (noise std σ·clip on "
                                                                  "every group sum).")
    styles_max_noise: Float | None = Field(
        None, gt=0, description="A style group whose released mean is mostly noise gets its class mean instead: "
                                "when its noise std (styles_noise_multiplier·clip over its noisy count) exceeds "
                                "this fraction of its image's peak above the background (post-processing). null: "
                                "only groups of fewer than 20 noisy records.")
    polarity_noise_multiplier: Float | None = Field(
        None, gt=0, description="σ_p > 0: a release after the class means, for images whose colours vary (a class "
                                "mean of shapes in random colours is a flat grey): the means of each record's "
                                "luminance less its own mean (unit norm, signed so its rarer tone is bright) over "
                                "every class's two groups, shape lighter or darker than the rest (noise std σ_p·clip "
                                "on every sum). Drawn grey, they are the generator's two slots per class. Needs "
                                "warmup.intensity_noise_multiplier. null: no such release.")
    variations: Int = Field(0, ge=0, le=32, description="r > 0: a third release, each class's r main directions of "
                                                        "variation (0: none).")
    variations_noise_multiplier: Float = Field(2.0, gt=0, description="σ of that release (noise std "
                                                                      "σ·variations_clip² per entry).")
    variations_clip: Float = Field(5.0, gt=0, description="L2 bound of a record's residual (in [0, 1] pixel units) "
                                                          "around its image.")
    variations_shared: Bool = Field(False, description="true: one second-moment matrix summed over every class "
                                                       "before the noise, its directions shared by every class "
                                                       "(the same event; about K times the signal for the same "
                                                       "noise: what pays at a low ε). warmup.fit_epsilon sets it "
                                                       "where the per-class release does not fit.")
    steps: Int | None = Field(None, ge=0, description="Generator regression steps on the deformed central images (no "
                                                      "data access). null: 40 × train.steps, at most 4,000 (a small "
                                                      "run's fit is small; the shipped recipes' 100+ steps give 4,000).")
    batch_size: Int = Field(128, ge=1)
    lr: Float = Field(1e-3, gt=0)
    fit_epsilon: Bool = Field(False, description="true: where the releases do not fit privacy.epsilon, they are "
                                                 "refitted from ε alone: with variations, the releases get 3/4 of ε, "
                                                 "the variation release shared by every class, its σ (and at low ε "
                                                 "the class means') calibrated, the polarity shapes left out where "
                                                 "they would take over half; else releases are left out, the last "
                                                 "in the trace first. The run's stored configuration shows the "
                                                 "result. false: such a configuration is refused.")

    def releases(self) -> list[tuple[str, float]]:
        """(name, σ) of every release this section makes, in the order of the trace."""
        named = [("intensity_histogram", self.intensity_noise_multiplier)] * (self.intensity_noise_multiplier is not None)
        named += [("class_means", self.noise_multiplier)]
        named += [("polarity_shapes", self.polarity_noise_multiplier)] * (self.polarity_noise_multiplier is not None)
        styles = [("styles", self.styles_noise_multiplier)] * bool(self.styles)
        variations = [("variations", self.variations_noise_multiplier)] * bool(self.variations)
        return named + (variations + styles if self.styles_along_variations else styles + variations)

    @property
    def styles_along_variations(self) -> bool:
        """Whether the style release's templates move along the released variation directions (then it follows the
        variation release in the trace)."""
        return bool(self.styles) and self.styles_along == "variations"


@dataclass(frozen=True, config=SECTION)
class GSWGANConfig:
    """GS-WGAN (Chen, Orekondy & Fritz 2020) and the GS-WGAN part of DPAC; defaults are the paper's.

    ``train.steps`` is T (private generator iterations), ``train.seed`` and ``train.device``
    apply; ``privacy.max_grad_norm`` is the clip bound C and ``privacy.noise_multiplier`` the
    per-release σ (noise std / C of each sanitized ∂L_G/∂G(z_i)). The ``train`` section's batch
    size, widths and learning rates are DPGAN's and are not used here; ``train.n_d`` is n_dis.
    """

    pretrain_iterations: Int = Field(2000, ge=0, description="T_w: non-private iterations per shard (0: D_k starts "
                                                              "fresh).")
    batch_size: Int = Field(32, ge=1, description="B: real and fake records per critic step, sanitized samples per "
                                                  "G step.")
    gp_weight: Float = Field(10.0, ge=0, description="WGAN-GP λ.")
    drift_weight: Float = Field(0.001, ge=0, description="ε_drift · E[D(x)²] (the authors' L_epsilon).")
    lr_d: Float = Field(1e-4, gt=0)
    lr_g: Float = Field(1e-4, gt=0)
    adam_beta1: Float = Field(0.5, ge=0, lt=1)
    adam_beta2: Float = Field(0.99, ge=0, lt=1)
    d_width: Int = Field(64, ge=1, description="DCGAN discriminator, spectral norm, label projection.")
    g_width: Int = Field(64, ge=1, description="The generator's width (either architecture).")
    generator: Literal["resnet", "dcgan"] = Field(
        "resnet", description="resnet: the paper's ResNet generator (spectral norm); dcgan: dpsynth's DCGAN "
                              "generator (DPGAN's: style slots for the warm-up's style release, train.g_warp), far "
                              "cheaper on a CPU. Only G changes: the critics and the sanitized step are the paper's.")
    latent_dim: Int = Field(10, ge=1)
    ema_decay: Float = Field(0.999, ge=0, lt=1, description="The released generator is an EMA of G's weights; 0: G "
                                                            "itself.")


@dataclass(frozen=True, config=SECTION)
class DPACConfig:
    """DP-GAN-DPAC (Chen et al. 2023): GS-WGAN plus a fresh auxiliary classifier per iteration from t_c."""

    start_iteration: Int = Field(6000, ge=0, description="t_c: first generator iteration (0-based) that uses the "
                                                         "classifier.")
    beta: Float = Field(0.8, ge=0, le=1, description="L_G = β·L_D + (1 − β)·L_C, combined per sample before "
                                                     "sanitization.")
    n_f: Int = Field(10, ge=0, description="Classifier steps on one fixed class-balanced fake batch.")
    n_r: Int = Field(10, ge=0, description="Then classifier steps on real batches of the same shard.")
    lr_c: Float = Field(1e-4, gt=0)
    c_width: Int = Field(64, ge=1, description="DCGAN classifier.")


@dataclass(frozen=True, config=SECTION)
class ZhangConfig:
    """dp-GAN of Zhang, Ji & Wang (seed 004): WGAN-GP with a DP critic, parameter grouping,
    adaptive clipping bounds and a pre-training, both on public data (``data.public_*``)."""

    gp_weight: Float = Field(10.0, ge=0, description="λ of the gradient penalty.")
    grouping: Literal["global", "weight_bias", "per_layer", "clustering"] = Field(
        "clustering", description="global: one group; weight_bias: weights vs biases; per_layer: one group per "
                                  "layer; clustering: Algorithm 2 on per-tensor bounds from public data, into "
                                  "num_groups groups.")
    num_groups: Int = Field(5, ge=1, description="k for clustering.")
    adaptive_clipping: Bool = Field(True, description="Bounds = mean per-example group norm on a public batch.")
    update_every: Int = Field(1, ge=1, description="Critic steps between bound (and clustering) updates.")
    public_batch_size: Int = Field(64, ge=1, description="m_pub.")
    pretrain_iterations: Int = Field(300, ge=0, description="t_warm generator iterations on public data; 0: no "
                                                              "pre-training.")
    lr: Float = Field(2e-3, gt=0, description="Adam α of both networks (Table 1, MNIST).")
    lr_g: Float | None = Field(None, gt=0, description="The generator's Adam α when it differs (a slow G keeps a "
                                                       "private warm-up).")
    adam_beta1: Float = Field(0.5, ge=0, lt=1)
    adam_beta2: Float = Field(0.9, ge=0, lt=1)


@dataclass(frozen=True, config=SECTION)
class EvolutionConfig:
    """Private Evolution on the public prior (``train.method: private-evolution``; docs/prior.md): ``rounds``
    Gaussian histograms of the records' votes over ``candidates`` figures per class, σ from ``privacy`` (calibrated
    to ε unless privacy.noise_multiplier is set). The defaults are the settings frozen before the confirmation runs."""

    rounds: Int = Field(10, ge=1, description="T: rounds, one Gaussian histogram each (one full-batch event of "
                                              "the trace).")
    candidates: Int = Field(200, ge=2, description="M: candidate figures per class in every round.")
    threshold: Float = Field(2.0, ge=0, description="H in units of the noise σ: a candidate whose noisy votes fall "
                                                    "below H·σ gets no offspring (post-processing).")
    step_first: Float = Field(0.3, gt=0, le=1, description="The variation step after the first round.")
    step_last: Float = Field(0.05, gt=0, le=1, description="The variation step before the last round (geometric "
                                                           "in between); at most step_first.")
    fresh: Float = Field(0.05, ge=0, lt=1, description="Share of every class's next candidates drawn fresh from "
                                                       "the prior.")
    jitter: Float = Field(0.05, ge=0, le=1, description="The release's variation step: each sample is its drawn "
                                                        "figure varied by this step, then painted.")
    seed: Int = Field(0, ge=0, description="The public coins: the prior's draws, resampling and variations (never "
                                           "the noise: that is the mechanism's secret randomness).")
    feature: Literal["hybrid", "plane", "segmenter"] = Field(
        "hybrid", description="The records' colour-blind feature, each record's own: plane (each pixel's distance from "
                              "the record's background plane), segmenter (the figure mask the public segmenter "
                              "predicts), hybrid (plane on a flat ground, segmenter on a textured one).")

    @model_validator(mode="after")
    def _steps(self) -> EvolutionConfig:
        _require(self.step_last <= self.step_first, "evolution.step_last",
                 f"must be at most evolution.step_first ({self.step_first}), got {self.step_last}")
        return self


@dataclass(frozen=True, config=SECTION)
class SampleConfig:
    """What ``dpsynth sample`` writes after a passed audit."""

    num_samples: Int = Field(10000, ge=1, description="Synthetic records written by `dpsynth sample`, classes "
                                                      "balanced.")
    per_class: Int = Field(10, ge=1, description="Columns of the sample grid (one row per class).")
    screen: Float | None = Field(0.35, ge=0, le=1, description="Drop a released sample whose neighbouring-pixel "
                                                               "correlation is below this (a patch of noise; reads "
                                                               "the samples only, docs/privacy.md); null: keep all.")
    seed: Int = Field(0, ge=0)


@dataclass(frozen=True, config=SECTION)
class EvaluateConfig:
    """``dpsynth evaluate`` (see dpsynth.evaluation). ``suite``: quick runs ``classifier`` only;
    full runs every classifier of GS-WGAN's Tables A1–A2 (minutes on CPU)."""

    classifier: Literal["logreg", "cnn", "resnet", "mlp", "random_forest", "gaussian_nb", "bernoulli_nb",
                        "linear_svc", "decision_tree", "lda", "adaboost", "bagging", "gbm", "xgboost"] = Field(
        "cnn", description="The headline gen2real classifier (trained on synthetic data, tested on real reference "
                           "data): cnn, the small CNN of GS-WGAN's supplement, or resnet, a small ResNet trained "
                           "with random-crop augmentation (stronger on colour sets, several times the CPU time; docs/results.md). The "
                           "quick suite runs it and logistic regression (a fast extra).")
    resnet_epochs: Int = Field(15, ge=1, description="resnet: passes over the training data (augmented batches "
                                                     "converge later than the CNN's; the best epoch is chosen on "
                                                     "held-out synthetic data).")
    ceiling: Bool = Field(True, description="Train the headline classifier on the private training records too and "
                                            "test it on the held-out records: the ceiling the release is a share "
                                            "of, written to the operator's report in the sensitive zone "
                                            "(evaluate/operator.json), never released.")
    flip: Bool = Field(False, description="resnet: also mirror training images left-right (only for classes that "
                                          "are mirror-invariant; glyphs and digits are not).")
    suite: Literal["quick", "full"] = "quick"
    max_iter: Int = Field(200, ge=1, description="logreg: solver iterations.")
    epochs: Int = Field(5, ge=1, description="cnn / mlp: passes over the synthetic data (the best epoch is chosen "
                                             "on held-out synthetic data).")
    feature_steps: Int = Field(150, ge=1, description="The reference CNN (fid_classifier, IS, JS): batches of 64 "
                                                      "real reference records.")
    validation_fraction: Float = Field(0.1, gt=0, lt=1, description="Synthetic records held out for model "
                                                                    "selection (never real data).")
    max_train_records: Int | None = Field(20000, ge=10, description="Cap on synthetic records a classifier trains "
                                                                    "on; null: all.")
    reference_uri: str | None = Field(None, description="Real data the metrics compare with. null: the partition's "
                                                        "held-out records (never trained on).")
    reference_kind: Literal["heldout", "public", "sensitive"] = Field(
        "heldout", description="What reference_uri is: public or heldout (never trained on) make the metrics "
                               "releasable; sensitive (e.g. training records) labels them internal. Must be heldout "
                               "when reference_uri is null.")
    inception_weights: str | None = Field(
        None, description="A TorchScript pytorch-fid Inception-v3 pool3 extractor (see dpsynth.evaluation.fid); "
                          "null or missing file: the Fréchet distance is computed on the reference classifier's "
                          "features as fid_classifier.")
    mia: Bool = Field(True, description="Membership inference (GAN-Leaks, black box); reads training records: "
                                        "internal.")
    mia_records: Int = Field(500, ge=2, description="Training (held-in) and held-out records each, at most.")
    mia_generated: Int = Field(5000, ge=1, description="Generated samples the attack compares each record with.")
    curve_samples: Int = Field(2000, ge=0, description="ε-vs-metric curve over the generator snapshots the train "
                                                       "manifest lists (role generator_snapshot): generated samples "
                                                       "per snapshot; 0: no curve.")
    seed: Int = Field(0, ge=0)

    @model_validator(mode="after")
    def _reference(self) -> EvaluateConfig:
        _require(self.reference_uri is not None or self.reference_kind == "heldout", "evaluate.reference_kind",
                 f"must be 'heldout' when evaluate.reference_uri is unset (the partition's held-out records), "
                 f"got {self.reference_kind!r}")
        return self


@dataclass(frozen=True, config=SECTION)
class AuditConfig:
    """``dpsynth audit``'s empirical step (``dpsynth.audit.empirical``): audit runs of the method's training
    steps and of every warm-up release with canaries on public stand-ins, ε_lower at ``confidence``; the audit
    fails when ε_lower exceeds the accounted ε (or a warm-up release adds less noise than planned), and says
    "inconclusive" when no audit of that size could have failed. auto (default): quick for the methods that
    have an empirical audit, not run for the others; off: skipped; quick: the first ``quick_steps`` training
    steps; full: every step."""

    empirical: Literal["auto", "off", "quick", "full"] = Field(
        "auto", description="auto: quick for the methods that have one, none for the others; off: skipped; quick: "
                            "the first quick_steps training steps; full: every step (the methods whose Method names an "
                            "empirical audit: dpsynth.methods.registry.empirical_audit_methods). The warm-up releases "
                            "are audited whole.")
    canaries: Int = Field(1000, ge=2, description="m: canary gradients inserted.")
    confidence: Float = Field(0.95, gt=0, lt=1, description="Confidence of the lower bound ε_lower.")
    quick_steps: Int = Field(100, ge=1)

    @field_validator("empirical", mode="before")
    @classmethod
    def _yaml_off(cls, value):
        return "off" if value is False else value  # YAML 1.1 reads `off` (audit.empirical=off) as false


@dataclass(frozen=True, config=SECTION)
class PipelineConfig:
    """The pipeline run the stages belong to."""

    run_dir: str | None = Field(None, description="Root URI (local or s3://) of one pipeline run: run_dir/sensitive, "
                                                  "run_dir/release.")


@dataclass(frozen=True, config=SECTION)
class RunConfig:
    """Every setting of a dpsynth run, by section (YAML: ``section: {field: value}``; ``--set section.field=value``)."""

    data: DataConfig = Field(default_factory=DataConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    zhang: ZhangConfig = Field(default_factory=ZhangConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    ledger: LedgerConfig = Field(default_factory=LedgerConfig)
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)
    warmup: WarmupConfig = Field(default_factory=WarmupConfig)
    gswgan: GSWGANConfig = Field(default_factory=GSWGANConfig)
    dpac: DPACConfig = Field(default_factory=DPACConfig)
    evolution: EvolutionConfig = Field(default_factory=EvolutionConfig)
    sample: SampleConfig = Field(default_factory=SampleConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    audit: AuditConfig = Field(default_factory=AuditConfig)
    pipeline: PipelineConfig = Field(default_factory=PipelineConfig)

    @model_validator(mode="after")
    def _across_sections(self, info: ValidationInfo) -> RunConfig:
        # refused before training spends anything, not at the audit. First the rules that depend on the method
        # (its networks, its audit, its own rules): the method registry's (dpsynth.methods.registry.check), which
        # the loader of a command that runs a method passes in (this module imports no method)
        check = (info.context or {}).get("check")
        if check is not None:
            check(self)
        _require(not self.train.g_tone or (self.warmup.central_images
                                           and self.warmup.intensity_noise_multiplier is not None), "train.g_tone",
                 "the tone layer matches the warm-up's released intensity histogram: set warmup.central_images=true "
                 "and warmup.intensity_noise_multiplier, or train.g_tone=false")
        w = self.warmup
        _require(not (w.central_images and w.polarity_noise_multiplier is not None)
                 or w.intensity_noise_multiplier is not None, "warmup.polarity_noise_multiplier",
                 "the polarity shapes are drawn around the intensity histogram's mean and spread: set "
                 "warmup.intensity_noise_multiplier too, or warmup.polarity_noise_multiplier=null")
        _require(not (w.central_images and w.polarity_noise_multiplier is not None and w.styles),
                 "warmup.polarity_noise_multiplier", "the polarity shapes and the style release both split the "
                 "classes into the generator's slots: set warmup.styles=0 or warmup.polarity_noise_multiplier=null")
        _require(not (w.central_images and w.styles_along_variations) or w.variations >= 2, "warmup.styles_along",
                 f"the style templates move along the two main variation directions: set warmup.variations >= 2 "
                 f"(got {w.variations}), or warmup.styles_along=deformations")
        if w.central_images and w.fit_epsilon:
            from dpsynth.warmup.epsilon import fit_epsilon

            fitted = fit_epsilon(w, self.privacy)
            return self if fitted == w else dataclasses.replace(self, warmup=fitted)
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def fingerprint(
        self, *, exclude: tuple[str, ...] = ("output", "tracking", "ledger", "pretrain", "sample", "evaluate", "audit",
                                  "pipeline")
    ) -> str:
        """sha256 of the settings that determine the training result (what resume must match)."""
        d = {k: v for k, v in without_launch(self.to_dict()).items() if k not in exclude}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


# train.* fields that place the train stage's ranks, not what it computes: a checkpoint resumes, and the stage's
# outputs are reused, on any number of ranks (docs/distributed.md), so no fingerprint includes them
LAUNCH_FIELDS = ("nodes", "gpus_per_node")


def without_launch(d: dict) -> dict:
    """``RunConfig.to_dict()`` without :data:`LAUNCH_FIELDS`: what fingerprints hash."""
    return {**d, "train": {k: v for k, v in d["train"].items() if k not in LAUNCH_FIELDS}}


@functools.cache
def _adapter() -> TypeAdapter:
    return TypeAdapter(RunConfig)


# --- who sets what -------------------------------------------------------------------------------------------
# The settings whoever triggers a run may choose (the Airflow form's fields and its extra settings, the KFP
# pipeline's inputs and ``extra``): the recipe. "section.*" is every setting of the section. Every other setting
# is the platform's (an allow-list: a setting added to the models is the platform's until it is listed here).
RUN_SETTINGS = ("data.uri", "privacy.epsilon", "privacy.delta", "privacy.noise_multiplier", "privacy.max_grad_norm",
                "train.*", "zhang.*", "gswgan.*", "dpac.*", "warmup.*", "evolution.*", "pretrain.*", "partition.num_shards",
                "sample.*", "evaluate.classifier", "evaluate.suite", "evaluate.max_iter", "evaluate.epochs",
                "evaluate.feature_steps", "evaluate.validation_fraction", "evaluate.max_train_records",
                "evaluate.mia", "evaluate.mia_records", "evaluate.mia_generated", "evaluate.curve_samples",
                "evaluate.seed", "audit.empirical", "output.checkpoint_every", "output.sample_every", "output.log_every")
# Who sets a setting a run may not: the first entry naming it or its section ("": any other).
SETTING_OWNERS = {
    "ledger.population_id": "the platform (the chart's pipeline.populationId; KFP: DPSYNTH_POPULATION_ID when "
                            "compiling)",
    "ledger": "the platform (the stage Secret's DPSYNTH_LEDGER_URL and the ledger's budgets)",
    "tracking": "the platform (its MLflow: DPSYNTH_TRACKING_URI, the Connection dpsynth_mlflow)",
    "partition.key": "the platform (the partition-key Secret, DPSYNTH_PARTITION_KEY, given to the partition stage "
                     "only)",
    "output": "the pipeline (each stage's directory under the run's)",
    "pipeline": "the pipeline (the run root and the pipeline run id)",
    "": "the platform (the base config in the stage image, or the chart's stage.config)",
}


@functools.cache
def run_settings() -> tuple[str, ...]:
    """:data:`RUN_SETTINGS` with each "section.*" spelled out: every setting a run's trigger may choose."""
    schema = _adapter().json_schema()
    names = []
    for section, ref in schema["properties"].items():
        fields = schema["$defs"][ref["$ref"].rsplit("/", 1)[1]]["properties"]
        names += [f"{section}.{f}" for f in fields if f"{section}.*" in RUN_SETTINGS or f"{section}.{f}" in RUN_SETTINGS]
    return tuple(names)


def owner(name: str) -> str:
    """Who sets ``name`` (``section.field``) when a run may not (:data:`SETTING_OWNERS`)."""
    section = name.split(".", 1)[0]
    return SETTING_OWNERS.get(name) or SETTING_OWNERS.get(section) or SETTING_OWNERS[""]


def refusal(item: str) -> str | None:
    """None when a trigger may give ``item`` (``section.field=value`` or a name), else one line naming the setting
    and who sets it."""
    name = str(item).split("=", 1)[0].strip()
    if name in run_settings():
        return None
    if name not in _all_settings():
        return f"{name}: no such setting (`dpsynth config schema` lists them)"
    return f"{name}: not a run's setting; {owner(name)} sets it"


@functools.cache
def _all_settings() -> frozenset[str]:
    schema = _adapter().json_schema()
    return frozenset(f"{section}.{f}" for section, ref in schema["properties"].items()
                     for f in schema["$defs"][ref["$ref"].rsplit("/", 1)[1]]["properties"])


@functools.cache
def _schema() -> dict:
    # x-dpsynth-run-settings / x-dpsynth-owners: who may set what, for the orchestrators that cannot import dpsynth
    # (the Airflow DAGs read this schema's JSON file); JSON Schema validators ignore x- keywords
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "dpsynth-config.schema.json",
            **_adapter().json_schema(), "x-dpsynth-run-settings": list(run_settings()),
            "x-dpsynth-owners": SETTING_OWNERS}


def json_schema() -> dict:
    """The JSON Schema (2020-12) of a config file: every section and setting with its type, bounds, default
    and description. ``dpsynth config schema`` prints it; a section or setting left out takes its default."""
    return copy.deepcopy(_schema())


def _describe(schema: dict) -> str:
    """What a setting's JSON Schema accepts, in words: "a number in (0, 1)", "an integer >= 1 or 'adaptive'"."""
    if "anyOf" in schema:
        return " or ".join(_describe(option) for option in schema["anyOf"])
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return f"one of {schema['enum']}"
    kind = {"integer": "an integer", "number": "a number", "boolean": "true or false", "string": "a string",
            "null": "null"}.get(schema.get("type"), "a mapping of settings")
    low = "[" if "minimum" in schema else "(" if "exclusiveMinimum" in schema else ""
    high = "]" if "maximum" in schema else ")" if "exclusiveMaximum" in schema else ""
    lo, hi = schema.get("minimum", schema.get("exclusiveMinimum")), schema.get("maximum", schema.get("exclusiveMaximum"))
    if low and high:
        kind += f" in {low}{lo}, {hi}{high}"
    elif low:
        kind += f" {'>=' if low == '[' else '>'} {lo}"
    elif high:
        kind += f" {'<=' if high == ']' else '<'} {hi}"
    if schema.get("pattern") == NOT_BLANK:
        kind = "a non-blank string"
    elif schema.get("minLength") == 1:
        kind = "a non-empty string"
    elif "pattern" in schema:
        kind += f" matching /{schema['pattern']}/"
    if "maxLength" in schema:
        kind += f" of at most {schema['maxLength']} characters"
    return kind


def setting_schema(name: str) -> dict:
    """The JSON Schema of a section (``"train"``) or of one setting (``"train.steps"``)."""
    schema = _schema()
    section, _, field = name.partition(".")
    node = schema["properties"][section]
    return copy.deepcopy(schema["$defs"][node["$ref"].rsplit("/", 1)[1]]["properties"][field] if field else node)


def _known(loc: tuple) -> list[str]:
    cls = RunConfig if not loc else type(getattr(RunConfig(), loc[0]))
    return sorted(f.name for f in dataclasses.fields(cls))


def _config_error(exc: ValidationError) -> ConfigError:
    """pydantic's errors as one ConfigError, a line per setting, each naming it (``section.field: ...``)."""
    lines: dict[str, str] = {}
    for error in exc.errors():
        loc = error["loc"][:2]  # (section, field); further entries name the branch of a union that failed
        name = ".".join(map(str, loc))
        if error["type"] == "value_error":  # a check across settings: its message names the setting
            lines.setdefault(name, str(error["ctx"]["error"]))
        elif error["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            lines.setdefault(name, f"{name}: unknown setting (known: {', '.join(_known(loc[:-1]))})")
        else:
            lines.setdefault(name, f"{name}: must be {_describe(setting_schema(name))}, got {error['input']!r}")
    return ConfigError("\n".join(lines.values()))


# Settings that were renamed: a file or --set that still names one is refused with the new name.
RENAMED = {"gswgan.n_dis": "train.n_d (one name in every method)",
           "zhang.n_critic": "train.n_d (one name in every method)",
           # the non-private stage is "pre-training" (#53): "warm-up" names only the private releases
           "warmstart": "pretrain", "gswgan.warmstart_iterations": "gswgan.pretrain_iterations", "zhang.warm_start_iterations": "zhang.pretrain_iterations"}


def _set_path(d: dict, dotted: str, raw: str) -> None:
    keys = dotted.split(".")
    for key in keys[:-1]:
        d = d.setdefault(key, {})
        if not isinstance(d, dict):
            raise ConfigError(f"{dotted}: {key} is not a section")
    d[keys[-1]] = yaml.load(raw, Loader=_Loader)


def load_config(path: str | Path | None = None, *, overrides: list[str] | tuple[str, ...] = (),
                check: Callable[[RunConfig], None] | None = None) -> RunConfig:
    """Read a YAML file (optional), apply ``section.field=value`` overrides, build and validate. ``check``: the rules
    that depend on the method (:func:`dpsynth.methods.registry.check`; a command that runs a method loads through
    :func:`dpsynth.methods.registry.load_config`, which passes it), run before the warm-up is fitted."""
    values: dict = {}
    if path is not None:
        try:
            values = yaml.load(Path(path).read_text(), Loader=_Loader) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"config file {path}: cannot read it ({exc})") from None
        if not isinstance(values, dict):
            raise ConfigError(f"config file {path}: expected a mapping of sections")
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected section.field=value")
        key, raw = item.split("=", 1)
        _set_path(values, key.strip(), raw)
    for old_name, new_name in RENAMED.items():
        section, _, field = old_name.partition(".")
        if (field in values[section] if field and isinstance(values.get(section), dict)
                else not field and section in values):
            raise ConfigError(f"{old_name}: renamed {new_name}")
    try:
        return _adapter().validate_python(values, context={"check": check})
    except ValidationError as exc:
        raise _config_error(exc) from None


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
