"""Each method's networks from the configuration, and the files of its pre-trained ones (sensitive zone; the
pre-training runs themselves: :mod:`dpsynth.methods.pretraining`).

* DPGAN and dp-GAN (Zhang et al.): the label-conditioned DCGAN, :func:`dcgan_models`; dp-GAN's pre-training file;
* GS-WGAN, DPAC and the federated GS-WGAN: G (:func:`generator_record`, the released generator's ``model``
  record; :func:`generator_models`: G, its EMA copy and its Adam), D_k (:func:`fresh_discriminator`, or
  pre-trained: :func:`read_discriminator`) and their Adam.
"""

from __future__ import annotations

import torch

from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.errors import ConfigError
from dpsynth.models.dcgan import Discriminator as DCGANDiscriminator, Generator as DCGANGenerator
from dpsynth.models.gswgan_networks import Discriminator
from dpsynth.warmup import fit as warmup
from dpsynth.training.artifacts import build_generator, read_model_file
from dpsynth.training.seeds import derived_seed, init_with_seed

DISCRIMINATOR_FORMAT = "dpsynth.gswgan.discriminator/1"
PRETRAINED_FORMAT = "dpsynth.zhang_pretrain/1"


# --- DPGAN, dp-GAN ----------------------------------------------------------------------------------


def tone(cfg: RunConfig, channels: int) -> bool:
    """Whether the DCGAN generator ends with the tone layer (``train.g_tone``): on single-channel images only. On
    colour images one monotone map of every channel together, matched to the intensities of all channels pooled,
    cannot give colours, and at a low ε it stretched a nearly flat generator's noise into coloured static
    (docs/results.md, "The tone layer")."""
    return cfg.train.g_tone and channels == 1


def dcgan_models(cfg: RunConfig, *, num_classes: int, image_shape: tuple[int, int, int]):
    """G and D of DPGAN and dp-GAN: the label-conditioned DCGAN (``train.*`` widths and latent size), built by the
    global RNG in that order."""
    channels, size, _ = image_shape
    t = cfg.train
    G = DCGANGenerator(num_classes=num_classes, channels=channels, image_size=size, width=t.g_width,
                       latent_dim=t.latent_dim, styles=warmup.style_slots(cfg), warp=t.g_warp, contrast=t.g_contrast,
                       tone=tone(cfg, channels))
    D = DCGANDiscriminator(num_classes=num_classes, channels=channels, image_size=size, width=t.d_width)
    return G, D


def load_pretrained(data: bytes) -> dict:
    """dp-GAN's pre-training file: G and D trained on the public records."""
    return read_model_file(data, PRETRAINED_FORMAT, weights_only=False,
                           refusal=f"train.method: the pre-training file is not a {PRETRAINED_FORMAT!r} file")


def warm_models_record(cfg: RunConfig, *, num_classes: int, image_shape) -> dict:
    """What dp-GAN's pre-training file records of its G and D (``model``), for this run's settings."""
    t = cfg.train
    return {"num_classes": num_classes, "image_shape": list(image_shape), "g_width": t.g_width, "d_width": t.d_width,
            "latent_dim": t.latent_dim}


def load_warm_models(cfg: RunConfig, state: dict, G, D, *, num_classes: int, image_shape) -> None:
    """Load dp-GAN's pre-training (:func:`load_pretrained`) into G and D, after checking it was trained for them."""
    expected = warm_models_record(cfg, num_classes=num_classes, image_shape=image_shape)
    if state.get("model") != expected:
        raise ConfigError(f"train: the pre-training was trained for {state.get('model')}, not {expected}")
    G.load_state_dict(state["G"])
    D.load_state_dict(state["D"])


# --- GS-WGAN, DPAC, federated GS-WGAN -------------------------------------------------------------


def image_spec(cfg: RunConfig, dataset: ImageDataset) -> dict:
    """num_classes, channels, image_size: GS-WGAN's networks need square images."""
    height, width, channels = dataset.shape
    if height != width:
        raise ConfigError(f"data.uri: GS-WGAN needs square images, got {height}×{width}")
    return {"num_classes": cfg.data.num_classes or dataset.num_classes, "channels": channels, "image_size": height}


def generator_record(cfg: RunConfig, spec: dict) -> dict:
    """G's class and keywords (the released generator's ``model`` record): the paper's ResNet generator, or
    with ``gswgan.generator=dcgan`` the DCGAN one (the warm-up's style slots, ``train.g_warp``)."""
    g = cfg.gswgan
    kwargs = {**spec, "width": g.g_width, "latent_dim": g.latent_dim}
    if g.generator == "dcgan":
        return {"class": "dpsynth.models.dcgan.Generator", **kwargs, "styles": warmup.style_slots(cfg),
                "warp": cfg.train.g_warp, "contrast": cfg.train.g_contrast,
                **({"tone": True} if tone(cfg, spec["channels"]) else {})}
    return {"class": "dpsynth.models.gswgan_networks.Generator", **kwargs}


def make_generator(cfg: RunConfig, spec: dict) -> torch.nn.Module:
    """A fresh G (:func:`generator_record`), initialised by the global RNG."""
    return build_generator(generator_record(cfg, spec))


def generator_models(cfg: RunConfig, spec: dict, device) -> dict:
    """GS-WGAN's G (from train.seed), its EMA copy G_ema (the released generator) and G's Adam."""
    G = init_with_seed(derived_seed(cfg.train.seed, "generator"), lambda: make_generator(cfg, spec)).to(device)
    G_ema = make_generator(cfg, spec).to(device).requires_grad_(False)
    G_ema.load_state_dict(G.state_dict())  # not deepcopy: parametrized classes would be shared
    return {"G": G, "G_ema": G_ema, "opt_g": gswgan_adam(G.parameters(), lr=cfg.gswgan.lr_g, cfg=cfg)}


def discriminator_kwargs(cfg: RunConfig, spec: dict) -> dict:
    """D_k's keywords (the pre-training file records them)."""
    return {**spec, "width": cfg.gswgan.d_width}


def gswgan_adam(params, *, lr: float, cfg: RunConfig) -> torch.optim.Adam:
    """GS-WGAN's Adam (``gswgan.adam_beta1``, ``gswgan.adam_beta2``)."""
    return torch.optim.Adam(params, lr=lr, betas=(cfg.gswgan.adam_beta1, cfg.gswgan.adam_beta2))


def fresh_discriminator(cfg: RunConfig, spec: dict, *, shard_index: int) -> Discriminator:
    """D_k's initial weights: a function of train.seed and k only."""
    kwargs = discriminator_kwargs(cfg, spec)
    return init_with_seed(derived_seed(cfg.train.seed, "discriminator", shard_index), lambda: Discriminator(**kwargs))


def read_discriminator(data: bytes, *, expect_kwargs: dict, shard_index: int) -> dict:
    """The state_dict of a pre-trained D_k file, after checking it is one and matches this run."""
    state = read_model_file(data, DISCRIMINATOR_FORMAT,
                            refusal=f"pretrain: shard {shard_index}'s file is not a GS-WGAN discriminator")
    if state.get("shard") != shard_index or state.get("model") != expect_kwargs:
        raise ConfigError(f"pretrain: shard {shard_index}'s discriminator was trained for shard "
                          f"{state.get('shard')} with {state.get('model')}, this run needs {expect_kwargs}")
    return state["state_dict"]
