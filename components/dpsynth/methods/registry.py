"""The training methods dpsynth knows, in one table: what ``train.method`` may name.

Every place that depends on the method — ``dpsynth train``, the warmstart, train and audit
stages — reads this table; none keeps a table of its own. A :class:`Method` holds its privacy
mechanism (:mod:`dpsynth.mechanisms`: the plan, events, statement and sanitizer the trainer and the audit
share) and loaders of its trainer class and warm start — plain imports inside small functions, so the table
itself imports no torch (``dpsynth --help`` reads it).

A trainer class is built as ``Trainer(cfg, data, *, parent_run_id=, run_tags=, **inputs)`` and
``.train()`` returns a frozen result dataclass; it logs no image, model or dataset hash to MLflow
(nothing before the gate) and declares what it does log (``Trainer.MLFLOW_KEYS``). ``data`` and ``inputs`` depend on
the warm-start kind:

* ``"none"``: ``data`` is the training dataset; no inputs. Runs standalone (``dpsynth train``).
* ``"shard"``: ``data`` is the list of the K shard datasets; ``warm`` = {k: D_k file bytes}, from
  the warmstart stage (one non-private discriminator per shard).
* ``"public"``: ``data`` is the private training dataset; ``public`` (the partition's public
  records) and ``warm_start_state`` (the warmstart stage's G and D trained on them).

The methods with a warm start need the pipeline's stages (shards, warm start), so ``dpsynth
train`` without ``--run-dir`` refuses them (:func:`standalone_or_refuse`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from dpsynth.errors import ConfigError
from dpsynth.mechanisms.discriminator import DPGAN, ZHANG
from dpsynth.mechanisms.generator_gradient import FEDERATED, GSWGAN
from dpsynth.mechanisms.mechanism import Mechanism
from dpsynth.mechanisms.histograms import PRIVATE_EVOLUTION

WarmStart = Literal["none", "shard", "public"]


@dataclass(frozen=True)
class Method:
    name: str
    description: str  # one line
    trainer: Callable[[], type]  # the trainer class, imported when called
    warm_start: WarmStart
    sections: tuple[str, ...]  # config sections the method reads besides data, partition, privacy, train
    mechanism: Mechanism  # plan(cfg, n), events, statement(cfg, plan, n), sanitizer: for the trainer and the audit
    # the warm start, imported when called (shard: per shard; public: on the public records); None: "none"
    warm_start_function: Callable[[], Callable] | None = None
    # The white-box canaries of the empirical audit (dpsynth.audit.empirical): "gradient" (per-example gradients
    # in DP-SGD's GradientSanitizer), "input_gradient" (GS-WGAN's InputGradientSanitizer of ∂ℓ/∂G(z)), "votes"
    # (Private Evolution's histogram bins); "" not audited yet.
    empirical_audit: str = ""

    @property
    def standalone(self) -> bool:
        """Whether ``dpsynth train`` can run it on a dataset alone (no stage inputs)."""
        return self.warm_start == "none"

    def trainer_class(self) -> type:
        return self.trainer()

    def warm_start_fn(self):
        return self.warm_start_function() if self.warm_start_function else None


# --- the loaders: the trainers and warm starts import torch, the table does not ------------------------------


def _dpgan() -> type:
    from dpsynth.methods.dpgan import DPGANTrainer
    return DPGANTrainer


def _gswgan() -> type:
    from dpsynth.methods.gswgan import GSWGANTrainer
    return GSWGANTrainer


def _dpac() -> type:
    from dpsynth.methods.dpac import DPACTrainer
    return DPACTrainer


def _zhang() -> type:
    from dpsynth.methods.zhang import ZhangTrainer
    return ZhangTrainer


def _federated() -> type:
    from dpsynth.methods.federated_processes import FederatedProcesses
    return FederatedProcesses


def _private_evolution() -> type:
    from dpsynth.methods.private_evolution import PrivateEvolutionTrainer
    return PrivateEvolutionTrainer


def _shard_warm_start() -> Callable:
    from dpsynth.methods.warm_starts import warm_start_shard
    return warm_start_shard


def _public_warm_start() -> Callable:
    from dpsynth.methods.warm_starts import warm_start
    return warm_start


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("dpgan", "DPGAN of Bie et al., 'Private GANs, Revisited': DP-SGD discriminator, Poisson sampling",
           _dpgan, "none", (), DPGAN, empirical_audit="gradient"),
    Method("gswgan", "GS-WGAN (Chen et al. 2020): sanitized generator gradients, K warm-started shard critics",
           _gswgan, "shard", ("gswgan",), GSWGAN, _shard_warm_start, empirical_audit="input_gradient"),
    Method("dpac", "DP-GAN-DPAC (Chen et al. 2023): GS-WGAN plus a dual-purpose auxiliary classifier",
           _dpac, "shard", ("gswgan", "dpac"), GSWGAN, _shard_warm_start, empirical_audit="input_gradient"),
    Method("zhang", "dp-GAN (Zhang et al.): WGAN-GP with a DP critic, parameter grouping, public warm start",
           _zhang, "public", ("zhang",), ZHANG, _public_warm_start, empirical_audit="gradient"),
    Method("gswgan_federated", "federated GS-WGAN: server and K clients, the ranks of one torchrun job (gloo)",
           _federated, "shard", ("gswgan",), FEDERATED, _shard_warm_start),
    Method("private-evolution", "Private Evolution (Lin et al. 2024) on the public prior (Sim-PE): noisy votes for "
           "rendered figures", _private_evolution, "none",
           ("evolution",), PRIVATE_EVOLUTION, empirical_audit="votes"),
)}



def empirical_audit_methods() -> tuple[str, ...]:
    """The methods the empirical audit (``audit.empirical``) can audit."""
    return tuple(name for name, m in METHODS.items() if m.empirical_audit)


def get(name: str) -> Method:
    """The method ``train.method`` names; ConfigError naming the field otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        if name == "auto":
            raise ConfigError("train.method: 'auto' is picked from the data's public schema by the pipeline's stages "
                              "(registry.resolve) before a method is read; this command needs it resolved") from None
        raise ConfigError(f"train.method: unknown method {name!r} (known: {', '.join(METHODS)})") from None


def standalone_or_refuse(name: str) -> Method:
    """The method, when ``dpsynth train`` can run it alone; else ConfigError naming the command to use."""
    method = get(name)
    if not method.standalone:
        what = "K shards and their warm-started discriminators" if method.warm_start == "shard" else \
            "the partition's public records and a warm start on them"
        raise ConfigError(
            f"train.method: {name!r} needs {what} from the pipeline's stages, so plain `dpsynth train` cannot "
            f"run it; use `dpsynth pipeline run --config CONFIG --run-dir RUN_DIR` (or `dpsynth train --run-dir "
            f"RUN_DIR` after `dpsynth partition` and `dpsynth warmstart`)")
    return method


# --- train.method: auto -----------------------------------------------------------------------------------------
# the method auto picks by the data's public schema: colour images get Private Evolution on the rendered prior (the
# generic warm-up and DP-GAN give blurred averages there: docs/prior.md); grey ones the warm-up and DP-GAN
COLOUR_METHOD, GREY_METHOD = "private-evolution", "dpgan"


def for_schema(channels: int) -> str:
    """The method ``train.method: auto`` picks for images of ``channels`` channels (public schema).

    >>> for_schema(3), for_schema(1)
    ('private-evolution', 'dpgan')
    """
    return COLOUR_METHOD if channels == 3 else GREY_METHOD


def resolve(cfg, *, channels: int):
    """``cfg`` with ``train.method: auto`` replaced by :func:`for_schema`'s method for ``channels`` (public);
    any other ``cfg`` unchanged. Where it picks Private Evolution, the settings of the grey recipe it does not read
    are reset (the warm-up off; no warp, contrast or tone layer): the stored configuration states what ran."""
    import dataclasses

    from dpsynth.config import AUTO

    if cfg.train.method != AUTO:
        return cfg
    method = for_schema(channels)
    if method == GREY_METHOD:
        return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, method=method))
    return dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, method=method, g_warp=False, g_contrast=0.0, g_tone=False),
        warmup=dataclasses.replace(cfg.warmup, central_images=False))
