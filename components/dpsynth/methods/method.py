"""A training method, as one typed object: each method file declares its own ``METHOD = Method(...)`` (its trainer
class, its mechanism, its pre-training, its default n_D, the networks it builds, its empirical audit, the rules its
settings must follow); :mod:`dpsynth.methods.registry` collects them. Nothing else in dpsynth names a method: a
stage, a command or the audit asks the method's object.

A trainer class is built as ``Trainer(cfg, data, *, parent_run_id=, run_tags=, **inputs)`` and ``.train()`` returns
a frozen result dataclass; it logs no image, model or dataset hash to MLflow (nothing before the gate) and declares
what it does log (``Trainer.MLFLOW_KEYS``). ``data`` and ``inputs`` depend on the pre-training kind:

* ``"none"``: ``data`` is the training dataset; no inputs. Runs standalone (``dpsynth train``).
* ``"shard"``: ``data`` is the list of the K shard datasets; ``warm`` = {k: D_k file bytes}, from
  the pretrain stage (one non-private discriminator per shard).
* ``"public"``: ``data`` is the private training dataset; ``public`` (the partition's public
  records) and ``pretrained_state`` (the pretrain stage's G and D trained on them).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal

from dpsynth.errors import ConfigError
from dpsynth.mechanisms.mechanism import Mechanism

if TYPE_CHECKING:
    from dpsynth.config import RunConfig

Pretrain = Literal["none", "shard", "public"]
# a method's generator and latent: "dcgan" (the DCGAN generator of dpsynth.models.dcgan, train.latent_dim) or
# "gswgan.generator" (the gswgan section's: GS-WGAN's ResNet or the DCGAN one, gswgan.latent_dim)
Networks = Literal["dcgan", "gswgan.generator"]


class Audit(enum.StrEnum):
    """The white-box canaries of a method's empirical audit (:mod:`dpsynth.audit.empirical`)."""

    GRADIENT = "gradient"  # per-example parameter gradients in DP-SGD's GradientSanitizer
    INPUT_GRADIENT = "input_gradient"  # GS-WGAN's InputGradientSanitizer of ∂ℓ/∂G(z)
    VOTES = "votes"  # Private Evolution's histogram bins


def _no_rules(cfg: RunConfig) -> None:
    del cfg


@dataclass(frozen=True)
class Method:
    name: str  # what train.method names (config.METHODS: the schema's names and their one-line descriptions)
    trainer: type  # its trainer class (a dpsynth.training.loop.Trainer, or the federated server's processes)
    mechanism: Mechanism  # plan(cfg, n), events, statement(cfg, plan, n), sanitizer: for the trainer and the audit
    pretrain: Pretrain = "none"
    # the pre-training the pretrain stage runs (shard: per shard; public: on the public records); None: "none"
    pretrain_function: Callable | None = None
    sections: tuple[str, ...] = ()  # config sections the method reads besides data, partition, privacy, train
    # train.n_d's default: its paper's discriminator (critic) steps per generator step; "adaptive": DPGAN's schedule
    # (the only method that takes it); None: the method has no discriminator (Private Evolution)
    default_n_d: int | Literal["adaptive"] | None = None
    networks: Networks = "gswgan.generator"
    # it trains on the ranks of a torchrun job: DP-SGD data-parallel, or its shards spread over them
    # (the wrapper of the distribution room); its trainer passes this to the loop's Trainer
    data_parallel: bool = False
    # its ranks are a server and K clients, not a data-parallel job (launched as K + 1 ranks of its own)
    federated: bool = False
    empirical_audit: Audit | None = None  # None: not audited yet
    # the method's own rules across sections, raising ConfigError naming the setting (run by registry.check, inside
    # the configuration's validation, before the warm-up is fitted)
    validate: Callable[[RunConfig], None] = _no_rules

    @property
    def standalone(self) -> bool:
        """Whether ``dpsynth train`` can run it on a dataset alone (no stage inputs)."""
        return self.pretrain == "none"

    def dcgan(self, cfg: RunConfig) -> bool:
        """Whether ``cfg``'s generator is a DCGAN one (``dcgan.Generator``: warp, contrast, tone and style slots)."""
        return self.networks == "dcgan" or cfg.gswgan.generator == "dcgan"

    def latent(self, cfg: RunConfig) -> tuple[int, str]:
        """``cfg``'s latent size for this method, and the setting that holds it."""
        return ((cfg.train.latent_dim, "train.latent_dim") if self.networks == "dcgan"
                else (cfg.gswgan.latent_dim, "gswgan.latent_dim"))


def require(ok: bool, name: str, message: str) -> None:
    """A method's rule (``Method.validate``): ConfigError naming the setting to change."""
    if not ok:
        raise ConfigError(f"{name}: {message}")
