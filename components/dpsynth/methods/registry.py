"""The training methods dpsynth knows: what ``train.method`` may name. Each method file declares its own
``METHOD`` (:class:`~dpsynth.methods.method.Method`: its trainer class, mechanism, pre-training, default n_D, networks,
empirical audit and rules); this module collects them from :data:`MODULES`, in the order of the configuration's
names (:data:`dpsynth.config.METHODS`, the schema's: the configuration, the ground floor, imports no method, so the
names and their one-line descriptions stay there, torch-free, for ``dpsynth --help`` and the orchestrators' forms).

Every place that depends on the method — ``dpsynth train``, the pretrain, train and audit stages, the
configuration's rules across sections (:func:`check`, through :func:`load_config`) — asks the method's object;
none keeps a table of its own and none compares ``train.method`` with a name. Importing this module imports every
trainer (torch): the ``--help`` paths do not.

The methods with a pre-training need the pipeline's stages (shards, pre-training), so ``dpsynth
train`` without ``--run-dir`` refuses them (:func:`standalone_or_refuse`).
"""

from __future__ import annotations

from pathlib import Path

from dpsynth import config
from dpsynth.config import AUTO
from dpsynth.errors import ConfigError
from dpsynth.methods import dpac, dpgan, federated_processes, gswgan, private_evolution, zhang
from dpsynth.methods.method import Audit, Method, Pretrain, require  # noqa: F401  (the registry's types)

MODULES = (dpgan, gswgan, dpac, zhang, federated_processes, private_evolution)  # each declares its METHOD
METHODS: dict[str, Method] = {module.METHOD.name: module.METHOD for module in MODULES}
if tuple(METHODS) != tuple(config.METHODS):
    raise ImportError(f"the method files declare {list(METHODS)}; dpsynth.config.METHODS names {list(config.METHODS)}")


def description(name: str) -> str:
    """The method's one line (``dpsynth train --help``)."""
    return config.METHODS[name]


def empirical_audit_methods() -> tuple[str, ...]:
    """The methods the empirical audit (``audit.empirical``) can audit."""
    return tuple(name for name, m in METHODS.items() if m.empirical_audit)


def data_parallel_methods() -> tuple[str, ...]:
    """The methods that train on the ranks of a torchrun job (``dpsynth train --launch``)."""
    return tuple(name for name, m in METHODS.items() if m.data_parallel)


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
        what = "K shards and their pre-trained discriminators" if method.pretrain == "shard" else \
            "the partition's public records and a pre-training on them"
        raise ConfigError(
            f"train.method: {name!r} needs {what} from the pipeline's stages, so plain `dpsynth train` cannot "
            f"run it; use `dpsynth pipeline run --config CONFIG --run-dir RUN_DIR` (or `dpsynth train --run-dir "
            f"RUN_DIR` after `dpsynth partition` and `dpsynth pretrain`)")
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

    if cfg.train.method != AUTO:
        return cfg
    method = for_schema(channels)
    if method == GREY_METHOD:
        return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, method=method))
    return dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, method=method, g_warp=False, g_contrast=0.0, g_tone=False),
        warmup=dataclasses.replace(cfg.warmup, central_images=False))


# --- the configuration's rules that depend on the method ----------------------------------------------------------


def check(cfg) -> None:
    """The rules across sections that depend on ``cfg``'s method (its networks, its empirical audit, its n_D and
    its own ``Method.validate``); ConfigError naming the setting. :func:`load_config` runs them inside the
    configuration's validation, before the warm-up is fitted to ε, so a run is refused before it spends anything.
    ``auto`` is checked as the method it picks for grey data (dpgan): it must run as written there; where it picks
    private-evolution, the settings that method does not read are reset (:func:`resolve`)."""
    audited = empirical_audit_methods()
    require(cfg.audit.empirical in ("off", "auto") or cfg.train.method in audited, "audit.empirical",
            f"the empirical audit supports train.method in {list(audited)}, not "
            f"{cfg.train.method!r} (yet); set audit.empirical=off")
    method = get(GREY_METHOD if cfg.train.method == AUTO else cfg.train.method)
    name, w, t = method.name, cfg.warmup, cfg.train
    method.validate(cfg)
    dcgan = method.dcgan(cfg)  # G is a dcgan.Generator
    require(t.n_d != "adaptive" or method.default_n_d == "adaptive", "train.n_d",
            f"'adaptive' is DPGAN's policy (Bie et al.); train.method={name!r} takes a number of critic steps "
            "per generator step (or null: the method's default)")
    latent, where = method.latent(cfg)
    require(not t.g_warp or dcgan, "train.g_warp",
            f"only the DCGAN generator (dcgan.Generator) warps, not train.method={name!r}'s ResNet one; "
            "set gswgan.generator=dcgan or train.g_warp=false")
    require(not t.g_contrast or dcgan, "train.g_contrast",
            f"only the DCGAN generator (dcgan.Generator) has the contrast layer, not train.method={name!r}'s "
            "ResNet one; set gswgan.generator=dcgan or train.g_contrast=0")
    require(not t.g_tone or dcgan, "train.g_tone",
            f"only the DCGAN generator (dcgan.Generator) has the tone layer, not train.method={name!r}'s "
            "ResNet one; set gswgan.generator=dcgan or train.g_tone=false")
    require(not t.g_warp or latent >= 6, "train.g_warp", f"the warp reads z[:, :6]: {where} must be >= 6, got {latent}")
    require(not (w.central_images and w.styles) or dcgan, "warmup.styles",
            f"the style release needs a generator with style slots (dcgan.Generator: dpgan, zhang, or "
            f"gswgan.generator=dcgan), not train.method={name!r}'s ResNet one; set warmup.styles=0")
    require(not (w.central_images and w.polarity_noise_multiplier is not None) or dcgan,
            "warmup.polarity_noise_multiplier",
            f"the polarity shapes need a generator with style slots (dcgan.Generator: dpgan, zhang, or "
            f"gswgan.generator=dcgan), not train.method={name!r}'s ResNet one; set it to null")
    require(not (w.central_images and w.variations) or latent >= 7 + w.variations,
            "warmup.variations", f"{w.variations} directions need {where} >= {7 + w.variations} "
            f"(z[:, 7:7 + r] weighs them), got {latent}")
    require(not w.central_images or latent >= 6, "warmup.central_images",
            f"the warm-up's deformations read z[:, :6]: {where} must be >= 6, got {latent}")


def load_config(path: str | Path | None = None, *, overrides: list[str] | tuple[str, ...] = ()) -> config.RunConfig:
    """:func:`dpsynth.config.load_config` with the method's rules (:func:`check`): what a command that runs a method
    loads. The configuration alone (``dpsynth.config.load_config``) checks every setting and the rules that do not
    depend on the method."""
    return config.load_config(path, overrides=overrides, check=check)
