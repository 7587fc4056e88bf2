"""Training checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint holds model and optimizer states, every RNG state, the n_D schedule and the
mechanism trace (the accountant's whole state), plus the fingerprint of the settings that
produced it; resuming under different settings is refused. Writes are atomic, so a run
killed mid-save resumes from the previous checkpoint.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from dpsynth import storage
from dpsynth.errors import ConfigError

FORMAT = "dpsynth.checkpoint/1"
LAST = "last.pt"


def save(directory: str | Path, state: dict) -> Path:
    buf = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buf)
    path = Path(directory) / LAST
    storage.write_bytes(path, buf.getvalue())
    return path


def load_latest(directory: str | Path, *, fingerprint: str) -> dict | None:
    path = Path(directory) / LAST
    if not path.exists():
        return None
    state = torch.load(io.BytesIO(path.read_bytes()), map_location="cpu", weights_only=False)
    if state.get("format") != FORMAT:
        raise ConfigError(f"output.dir: {path} is not a dpsynth checkpoint")
    if state.get("fingerprint") != fingerprint:
        raise ConfigError(
            f"output.dir: {path} was written under different settings; "
            "choose a new output.dir or set output.resume=false to start over"
        )
    return state


def begin(trainer, cfg, out: Path) -> Path:
    """What every trainer does before its loop: restore ``trainer`` from the last checkpoint in
    ``out/checkpoints`` (when ``output.resume``) and write the resolved config; returns the
    checkpoint directory."""
    from dpsynth.config import dump_config

    ckpt_dir = out / "checkpoints"
    if cfg.output.resume:
        state = load_latest(ckpt_dir, fingerprint=cfg.fingerprint())
        if state is not None:
            trainer.load_state_dict(state)
    out.mkdir(parents=True, exist_ok=True)
    storage.write_text(out / "config.yaml", dump_config(cfg))
    return ckpt_dir
