"""Training checkpoints: everything needed to continue a run exactly where it stopped.

A checkpoint holds model and optimizer states, every RNG state, the n_D schedule and the
mechanism trace (the accountant's whole state), plus the fingerprint of the settings that
produced it; resuming under different settings is refused. Writes are atomic, so a run
killed mid-save resumes from the previous checkpoint.

Lineage: while a ledger attempt is active (:func:`charging`, see :mod:`dpsynth.ledger.attempt`),
every checkpoint records the reservation and attempt that wrote it, and each save is that attempt's
heartbeat in the ledger; resuming is refused unless the checkpoint is the one the attempt adopted.

Mirror: while :func:`mirroring` a URI (the train stage of a remote run directory, which trains in a
temporary directory), every checkpoint and generator snapshot is also copied there before the
attempt's heartbeat, so that a retry on another machine resumes it (:func:`pull`) under the killed
attempt's reservation instead of training afresh under a new one.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

import torch

from dpsynth import storage
from dpsynth.errors import ConfigError

FORMAT = "dpsynth.checkpoint/1"
LAST = "last.pt"
SNAPSHOTS = "snapshots"  # under checkpoints/: generator-<step>.pt at every checkpoint (sensitive zone)
LINEAGE = "ledger_attempt"  # the state key: {"reservation_id", "attempt_id"} of the attempt that wrote it
_ATTEMPT: ContextVar = ContextVar("dpsynth_ledger_attempt", default=None)
_MIRROR: ContextVar = ContextVar("dpsynth_checkpoint_mirror", default=None)


@contextlib.contextmanager
def charging(attempt) -> Iterator[None]:
    """Checkpoints written inside carry ``attempt.lineage`` and call ``attempt.heartbeat(steps)``;
    a checkpoint loaded inside must carry ``attempt.resumes_id``."""
    token = _ATTEMPT.set(attempt)
    try:
        yield
    finally:
        _ATTEMPT.reset(token)


@contextlib.contextmanager
def mirroring(uri: str | None) -> Iterator[None]:
    """Checkpoints and snapshots written inside are also copied under ``uri`` (None: not mirrored)."""
    token = _MIRROR.set(uri)
    try:
        yield
    finally:
        _MIRROR.reset(token)


def pull(uri: str, directory: str | Path) -> list[str]:
    """Copy the checkpoint files mirrored under ``uri`` into ``directory``; returns their relative names."""
    names = []
    for src in storage.list_uris(uri):
        name = src[len(str(uri).rstrip("/")) + 1:]
        storage.copy(src, Path(directory) / name)
        names.append(name)
    return names


def clear_mirror(uri: str) -> None:
    """Delete what is mirrored under ``uri`` (the local checkpoints were discarded)."""
    for found in storage.list_uris(uri):
        storage.delete(found)


TORCH_RNG = "torch_rng"  # a state field of this name holds nothing: the global CPU generator (torch.get_rng_state)


def capture(owner, names) -> dict:
    """The checkpoint state of ``owner``'s attributes ``names``, in that order: ``state_dict()`` of what has one
    (modules, optimizers, the secret coins), a torch.Generator's ``get_state()``, the value itself otherwise
    (counters, dicts of states); :data:`TORCH_RNG` is the global CPU generator's state."""
    return {name: torch.get_rng_state() if name == TORCH_RNG else _state_of(getattr(owner, name)) for name in names}


def restore(owner, names, state: dict) -> None:
    """The inverse of :func:`capture`: load ``state`` into ``owner``'s attributes ``names``."""
    for name in names:
        if name == TORCH_RNG:
            torch.set_rng_state(state[name])
            continue
        obj = getattr(owner, name)
        if isinstance(obj, torch.Generator):
            obj.set_state(state[name])
        elif hasattr(obj, "load_state_dict"):
            obj.load_state_dict(state[name])
        else:
            setattr(owner, name, state[name])


TRANSIENT = {"checkpoint": False}  # metadata of a state field no checkpoint holds (a view of others, a last value)


def state_fields(state) -> tuple[str, ...]:
    """What a checkpoint holds of a method's state dataclass: its fields, in order, but the :data:`TRANSIENT` ones
    (a field named :data:`TORCH_RNG` stands for the global CPU generator)."""
    return tuple(f.name for f in dataclasses.fields(state) if f.metadata.get("checkpoint", True))


def capture_state(state) -> dict:
    """:func:`capture` of a method's state dataclass (:func:`state_fields`)."""
    return capture(state, state_fields(state))


def restore_state(state, saved: dict) -> None:
    """The inverse of :func:`capture_state`."""
    restore(state, state_fields(state), saved)


def _state_of(obj):
    if isinstance(obj, torch.Generator):
        return obj.get_state()
    return obj.state_dict() if hasattr(obj, "state_dict") else obj


def cpu_copy(obj):
    """A copy of ``obj`` (tensors, dicts and lists of them) with every tensor on the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [cpu_copy(v) for v in obj]
    return copy.deepcopy(obj)


def _write(directory: str | Path, name: str, data: bytes) -> Path:
    path = Path(directory) / name
    storage.write_bytes(path, data)
    if (mirror := _MIRROR.get()) is not None:
        storage.write_bytes(storage.join(mirror, *Path(name).parts), data)
    return path


def save_snapshot(directory: str | Path, step: int, data: bytes) -> Path:
    """A generator snapshot at ``step`` (a ``dpsynth.generator/1`` file) under ``directory``/snapshots."""
    return _write(directory, f"{SNAPSHOTS}/generator-{step:07d}.pt", data)


def save(directory: str | Path, state: dict) -> Path:
    attempt = _ATTEMPT.get()
    if attempt is not None:
        state = {**state, LINEAGE: attempt.lineage}
    buf = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buf)
    path = _write(directory, LAST, buf.getvalue())
    if attempt is not None:
        attempt.heartbeat(int((state.get("trace") or {}).get("steps", 0)))
    return path


def lineage(directory: str | Path) -> dict | None:
    """``{"reservation_id", "attempt_id", "trace"}`` of the last checkpoint in ``directory`` (ids None
    when it was written outside a ledger attempt); None when there is none. Reads only those fields
    (the file is memory-mapped)."""
    path = Path(directory) / LAST
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    if state.get("format") != FORMAT:
        raise ConfigError(f"output.dir: {path} is not a dpsynth checkpoint")
    found = state.get(LINEAGE) or {}
    return {"reservation_id": found.get("reservation_id"), "attempt_id": found.get("attempt_id"),
            "trace": state.get("trace")}


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
    attempt = _ATTEMPT.get()
    written_by = (state.get(LINEAGE) or {}).get("reservation_id")
    if attempt is not None and written_by != attempt.resumes_id:
        raise ConfigError(
            f"output.dir: {path} was written under ledger reservation {written_by}, but this attempt adopted "
            f"{attempt.resumes_id}; refusing to resume a checkpoint its reservation does not account for")
    return state


def drop_foreign_snapshots(ckpt_dir: Path, *, resumed_step: int | None) -> None:
    """Remove the generator snapshots this run did not write: all of them when it starts afresh, those past
    the checkpoint it resumes otherwise (an earlier attempt's, under other settings: output.resume=false, another
    checkpoint_every). The train stage lists what remains as this run's, and evaluate releases metrics of them."""
    for path in sorted((Path(ckpt_dir) / SNAPSHOTS).glob("generator-*.pt")):
        step = int(path.stem.split("-", 1)[1]) if path.stem.split("-", 1)[1].isdigit() else None
        if resumed_step is None or step is None or step > resumed_step:
            path.unlink()
            if (mirror := _MIRROR.get()) is not None:
                storage.delete(storage.join(mirror, SNAPSHOTS, path.name))


def begin(trainer, cfg, out: Path) -> Path:
    """What every trainer does before its loop: restore ``trainer`` from the last checkpoint in
    ``out/checkpoints`` (when ``output.resume``) and write the resolved config; returns the
    checkpoint directory. Under a ledger attempt, the restored trace must be the one of the checkpoint the attempt
    adopted (:meth:`dpsynth.ledger.attempt.Attempt.check_restored`)."""
    from dpsynth.config import dump_config

    ckpt_dir = out / "checkpoints"
    state = load_latest(ckpt_dir, fingerprint=cfg.fingerprint()) if cfg.output.resume else None
    if state is not None:
        trainer.load_state_dict(state)
    if (attempt := _ATTEMPT.get()) is not None:  # the ledger adds this run's steps to the checkpoint it adopted
        attempt.check_restored(trainer.trace)
    drop_foreign_snapshots(ckpt_dir, resumed_step=None if state is None else state["step"])
    out.mkdir(parents=True, exist_ok=True)
    storage.write_text(out / "config.yaml", dump_config(cfg))
    return ckpt_dir
