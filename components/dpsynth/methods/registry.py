"""The training methods dpsynth knows, in one table: what ``train.method`` may name.

Every place that depends on the method — ``dpsynth train``, the warmstart, train and audit
stages — reads this table; none keeps a table of its own. A :class:`Method` names its trainer
class, its warm start, the config sections it reads and its audit invariants by ``"module:attr"``
references, imported only when used (the table itself imports no torch).

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

import importlib
from dataclasses import dataclass
from typing import Literal

from dpsynth.errors import ConfigError

WarmStart = Literal["none", "shard", "public"]


@dataclass(frozen=True)
class Method:
    name: str
    description: str  # one line
    trainer: str  # "module:Class"
    warm_start: WarmStart
    sections: tuple[str, ...]  # config sections the method reads besides data, partition, privacy, train
    invariants: str  # "module:function": fn(cfg, trace, n) -> [{"name", "passed", "detail"}], for the audit
    warm_start_function: str | None = None  # "module:function" (shard: per shard; public: on the public records)
    # For the audit: "module:function" fn(cfg, n) -> PrivacyPlan, the plan recomputed from the config and n
    # (its .trace is the trace the run must have written), and fn(cfg, plan, n) -> the privacy statement
    # (dpsynth.privacy.statement.Statement: adjacency, noise convention, assumptions, other accounts).
    plan: str = ""
    statement: str = ""
    # The white-box canaries of the empirical audit (dpsynth.audit.empirical): "gradient" (per-example gradients
    # in DP-SGD's GradientSanitizer), "input_gradient" (GS-WGAN's Sanitizer of ∂ℓ/∂G(z)); "" not audited yet.
    empirical_audit: str = ""
    # train.n_d's default for the method, its paper's: discriminator (critic) steps per generator step
    n_d: int | Literal["adaptive"] = "adaptive"

    @property
    def standalone(self) -> bool:
        """Whether ``dpsynth train`` can run it on a dataset alone (no stage inputs)."""
        return self.warm_start == "none"

    def trainer_class(self) -> type:
        return load(self.trainer)

    def audit_invariants(self):
        return load(self.invariants)

    def warm_start_fn(self):
        return load(self.warm_start_function) if self.warm_start_function else None

    def audit_plan(self):
        return load(self.plan)

    def audit_statement(self):
        return load(self.statement)


def load(ref: str):
    """The object a ``"module:attr"`` reference names."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


_SHARD_WARM_START = "dpsynth.methods.gswgan:warm_start_shard"
_GSWGAN_AUDIT = {"plan": "dpsynth.methods.gswgan:audit_plan", "statement": "dpsynth.methods.gswgan:privacy_statement"}

METHODS: dict[str, Method] = {m.name: m for m in (
    Method("dpgan", "DPGAN of Bie et al., 'Private GANs, Revisited': DP-SGD discriminator, Poisson sampling",
           "dpsynth.methods.dpgan:DPGANTrainer", "none", (), "dpsynth.methods.dpgan:audit_invariants",
           plan="dpsynth.methods.dpgan:plan_privacy", statement="dpsynth.methods.dpgan:privacy_statement",
           empirical_audit="gradient"),
    Method("gswgan", "GS-WGAN (Chen et al. 2020): sanitized generator gradients, K warm-started shard critics",
           "dpsynth.methods.gswgan:GSWGANTrainer", "shard", ("gswgan",), "dpsynth.methods.gswgan:audit_invariants",
           _SHARD_WARM_START, **_GSWGAN_AUDIT, empirical_audit="input_gradient", n_d=5),
    Method("dpac", "DP-GAN-DPAC (Chen et al. 2023): GS-WGAN plus a dual-purpose auxiliary classifier",
           "dpsynth.methods.dpac:DPACTrainer", "shard", ("gswgan", "dpac"), "dpsynth.methods.dpac:audit_invariants",
           _SHARD_WARM_START, **_GSWGAN_AUDIT, empirical_audit="input_gradient", n_d=5),
    Method("zhang", "dp-GAN (Zhang et al.): WGAN-GP with a DP critic, parameter grouping, public warm start",
           "dpsynth.methods.zhang:ZhangTrainer", "public", ("zhang",), "dpsynth.methods.zhang:audit_invariants",
           "dpsynth.methods.zhang:warm_start", plan="dpsynth.methods.zhang:audit_plan",
           statement="dpsynth.methods.zhang:privacy_statement", empirical_audit="gradient", n_d=4),
    Method("gswgan_federated", "federated GS-WGAN: server and K clients, the ranks of one torchrun job (gloo)",
           "dpsynth.methods.federated_processes:FederatedProcesses", "shard", ("gswgan",),
           "dpsynth.methods.gswgan_federated:audit_invariants", _SHARD_WARM_START,
           plan="dpsynth.methods.gswgan_federated:audit_plan",
           statement="dpsynth.methods.gswgan_federated:privacy_statement", n_d=5),
)}


def n_d(cfg) -> int | str:
    """Discriminator (critic) steps per generator step of ``cfg``'s run: ``train.n_d``, else its method's default
    (DPGAN: "adaptive"; GS-WGAN and DPAC: n_dis = 5; dp-GAN: n_critic = 4)."""
    return cfg.train.n_d if cfg.train.n_d is not None else get(cfg.train.method).n_d


def empirical_audit_methods() -> tuple[str, ...]:
    """The methods the empirical audit (``audit.empirical``) can audit."""
    return tuple(name for name, m in METHODS.items() if m.empirical_audit)


def get(name: str) -> Method:
    """The method ``train.method`` names; ConfigError naming the field otherwise."""
    try:
        return METHODS[name]
    except KeyError:
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
