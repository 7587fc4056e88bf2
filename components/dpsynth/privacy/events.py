"""Mechanism events and the mechanism trace: the one record of what touched the data.

A training step of DP-SGD (or a GS-WGAN generator step) is a *subsampled Gaussian
mechanism*: draw a batch from the sensitive data by some sampling scheme, clip each
record's contribution to norm C, sum, add N(0, (σC)² I). An accountant needs exactly
four facts about it, which :class:`MechanismEvent` holds:

* ``sampling``: ``"poisson"`` (each record independently with probability q),
  ``"without_replacement"`` (a fixed-size batch or one of K shards, q = batch/n or 1/K),
  ``"full_batch"`` (every record, q = 1);
* ``sample_rate`` q;
* ``noise_multiplier`` σ = noise std / C, *after* folding (see :func:`fold_releases`);
* ``sensitivity``: ``"add_remove"`` (neighbours differ by one added/removed record, so the
  clipped sum moves by ≤ C; pairs with Poisson sampling) or ``"replace_one"`` (one record
  replaced, the sum moves by ≤ 2C; pairs with fixed-size and shard sampling).

:class:`MechanismTrace` is the run-length list of events that training emits and that the
audit, the ledger and MLflow read back; its JSON form is versioned by a ``"format"`` key.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, Iterator

from dpsynth.errors import PrivacyError
from dpsynth.privacy.checks import as_count, check_noise, check_sample_rate

SAMPLINGS = ("poisson", "without_replacement", "full_batch")
SENSITIVITIES = ("add_remove", "replace_one")
TRACE_FORMAT = "dpsynth.mechanism_trace/1"


def full_batch_gaussian(noise_multiplier: float) -> MechanismEvent:
    """One Gaussian release on the whole dataset (no sampling) of add/remove sensitivity its clip: each warm-up
    release (:mod:`dpsynth.warmup.central_images`, and ``warmup.epsilon.fit_epsilon`` planning them)."""
    return MechanismEvent(sampling="full_batch", sample_rate=1.0, noise_multiplier=noise_multiplier,
                          sensitivity="add_remove")


def fold_releases(noise_multiplier: float, n_releases: int) -> float:
    """The noise multiplier of one Gaussian release equivalent to ``n_releases`` releases.

    Each release adds independent N(0, (σC)²) to a query of sensitivity C computed on the
    *same* sampled data (the B per-sample gradients of one GS-WGAN step on one shard, or the
    k clip groups of one dp-GAN step). Stacked, they are one Gaussian mechanism on a vector
    query whose sensitivity is C·√n (the n parts each move by ≤ C) with per-coordinate
    noise σC, i.e. noise multiplier σ/√n. Equivalently, the Rényi divergences add:
    n · α/(2σ²) = α/(2(σ/√n)²). Because the releases share one sample, subsampling
    amplifies the folded release *once*; counting them as n separately subsampled
    mechanisms (autodp ``coeff = T·B``) overstates privacy.
    """
    sigma = check_noise(noise_multiplier)
    n = as_count(n_releases, "n_releases")
    if n < 1:
        raise PrivacyError(f"n_releases: must be >= 1, got {n}")
    return sigma / math.sqrt(n)


@dataclass(frozen=True)
class MechanismEvent:
    """``count`` repetitions of one subsampled Gaussian mechanism (see the module docstring)."""

    sampling: str
    sample_rate: float
    noise_multiplier: float
    sensitivity: str
    count: int = 1

    def __post_init__(self) -> None:
        if self.sampling not in SAMPLINGS:
            raise PrivacyError(f"sampling: must be one of {', '.join(SAMPLINGS)}; got {self.sampling!r}")
        if self.sensitivity not in SENSITIVITIES:
            raise PrivacyError(
                f"sensitivity: must be one of {', '.join(SENSITIVITIES)}; got {self.sensitivity!r}"
            )
        q = check_sample_rate(self.sample_rate)
        if self.sampling == "full_batch" and q != 1:
            raise PrivacyError(f"sample_rate: full_batch sampling means sample_rate 1, got {q}")
        sigma = check_noise(self.noise_multiplier)
        object.__setattr__(self, "sample_rate", q)
        object.__setattr__(self, "noise_multiplier", sigma)
        object.__setattr__(self, "count", as_count(self.count, "count"))

    def same_mechanism(self, other: MechanismEvent) -> bool:
        """Whether the two events differ at most in ``count``."""
        return self.mechanism_key() == other.mechanism_key()

    def mechanism_key(self) -> tuple[str, float, float, str]:
        """All fields but ``count``."""
        return (self.sampling, self.sample_rate, self.noise_multiplier, self.sensitivity)

    def with_count(self, count: int) -> MechanismEvent:
        return replace(self, count=count)

    def with_noise(self, noise_multiplier: float) -> MechanismEvent:
        return replace(self, noise_multiplier=noise_multiplier)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MechanismEvent:
        if not isinstance(data, dict):
            raise PrivacyError(f"event: must be a mapping, got {type(data).__name__}")
        unknown = set(data) - {"sampling", "sample_rate", "noise_multiplier", "sensitivity", "count"}
        if unknown:
            raise PrivacyError(f"event: unknown field(s) {', '.join(sorted(unknown))}")
        try:
            return cls(**data)
        except TypeError as exc:  # a missing field
            raise PrivacyError(f"event: {exc}") from None


class MechanismTrace:
    """An ordered, run-length encoded list of :class:`MechanismEvent`.

    >>> e = MechanismEvent(sampling="poisson", sample_rate=0.01, noise_multiplier=1.0, sensitivity="add_remove")
    >>> t = MechanismTrace()
    >>> t.record(e); t.record(e, count=9)
    >>> t.steps, len(t.events)
    (10, 1)
    """

    def __init__(self, events: Iterable[MechanismEvent] = ()) -> None:
        self._events: list[MechanismEvent] = []
        for event in events:
            self.record(event)

    def record(self, event: MechanismEvent, count: int = 1) -> None:
        """Append ``count`` repetitions of ``event`` (that is, ``event.count * count`` steps).

        Merges with the last event when they differ only in ``count``; zero steps add nothing.
        """
        if not isinstance(event, MechanismEvent):
            raise PrivacyError(f"event: must be a MechanismEvent, got {type(event).__name__}")
        steps = event.count * as_count(count, "count")
        if steps == 0:
            return
        if self._events and self._events[-1].same_mechanism(event):
            last = self._events.pop()
            steps += last.count
        self._events.append(event.with_count(steps))

    @property
    def events(self) -> tuple[MechanismEvent, ...]:
        return tuple(self._events)

    @property
    def steps(self) -> int:
        return sum(e.count for e in self._events)

    def __iter__(self) -> Iterator[MechanismEvent]:
        return iter(tuple(self._events))

    def __len__(self) -> int:
        return len(self._events)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MechanismTrace):
            return NotImplemented
        return self._events == other._events

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"MechanismTrace(steps={self.steps}, events={self._events!r})"

    def copy(self) -> MechanismTrace:
        return MechanismTrace(self._events)

    def after(self, prefix: MechanismTrace) -> MechanismTrace:
        """The steps this trace adds to ``prefix`` (a checkpoint's trace it resumed from).

        >>> e = MechanismEvent(sampling="poisson", sample_rate=0.01, noise_multiplier=1.0, sensitivity="add_remove")
        >>> MechanismTrace([e.with_count(10)]).after(MechanismTrace([e.with_count(4)])).steps
        6

        PrivacyError when ``prefix`` is not a prefix of this trace.
        """
        mine, theirs = list(self._events), list(prefix.events)
        ok = len(theirs) <= len(mine) and all(a == b for a, b in zip(mine[:len(theirs) - 1], theirs[:-1]))
        if ok and theirs:
            last, grown = theirs[-1], mine[len(theirs) - 1]
            ok = last.same_mechanism(grown) and grown.count >= last.count
            if ok:
                rest = [grown.with_count(grown.count - last.count)] if grown.count > last.count else []
                return MechanismTrace(rest + mine[len(theirs):])
        if not ok:
            raise PrivacyError(f"trace: {prefix!r} is not a prefix of {self!r}")
        return self.copy()

    def to_dict(self) -> dict[str, Any]:
        return {"format": TRACE_FORMAT, "steps": self.steps, "events": [e.to_dict() for e in self._events]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MechanismTrace:
        if not isinstance(data, dict) or data.get("format") != TRACE_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise PrivacyError(f"format: expected {TRACE_FORMAT!r}, got {got!r}")
        events = data.get("events")
        if not isinstance(events, list):
            raise PrivacyError("events: must be a list")
        trace = cls(MechanismEvent.from_dict(e) for e in events)
        if "steps" in data and data["steps"] != trace.steps:
            raise PrivacyError(f"steps: recorded {data['steps']} but the events sum to {trace.steps}")
        return trace

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_json(cls, text: str) -> MechanismTrace:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PrivacyError(f"trace: not valid JSON ({exc})") from None
        return cls.from_dict(data)

    def state_dict(self) -> dict[str, Any]:
        return self.to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._events = MechanismTrace.from_dict(state)._events
