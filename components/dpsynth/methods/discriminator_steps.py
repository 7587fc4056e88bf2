"""How many discriminator steps n_D to take per generator step: ``train.n_d``, else the method's default (its
``Method.default_n_d``), and DPGAN's adaptive rule (Bie et al. §4, §6.2).

``FixedSteps`` keeps n_D constant. ``AdaptiveSteps`` keeps an EMA (decay β) of the
discriminator's accuracy on a fresh fake batch, observed before every generator step, and
moves n_D one notch up the ladder 1, 2, 5, 10, 20, 50, … when the EMA falls to the
threshold d — but only after a grace period of 2/(1−β) generator steps at the current
value. The EMA is never reset. The accuracy is measured on generated data only, with the
already-privatized discriminator, so it is post-processing and costs no privacy.
"""

from __future__ import annotations

from dataclasses import dataclass



def n_d(cfg, default: int | str) -> int | str:
    """Discriminator (critic) steps per generator step of ``cfg``'s run: ``train.n_d``, else ``default``, its
    method's (``Method.default_n_d``: DPGAN "adaptive"; GS-WGAN and DPAC n_dis = 5; dp-GAN n_critic = 4)."""
    return cfg.train.n_d if cfg.train.n_d is not None else default


def ladder_value(index: int) -> int:
    """The index-th value of 1, 2, 5, 10, 20, 50, 100, …"""
    return (1, 2, 5)[index % 3] * 10 ** (index // 3)


def ladder_index(value: int) -> int:
    index = 0
    while ladder_value(index) < value:
        index += 1
    if ladder_value(index) != value:
        raise ValueError(f"n_d: {value} is not on the ladder 1, 2, 5, 10, 20, 50, …")
    return index


class FixedSteps:
    def __init__(self, n_d: int):
        if n_d < 1:
            raise ValueError("n_d: must be >= 1")
        self.n_d = n_d

    def observe(self, fake_accuracy: float) -> None:
        del fake_accuracy

    @property
    def ema(self) -> float | None:
        return None

    def state_dict(self) -> dict:
        return {"n_d": self.n_d}

    def load_state_dict(self, state: dict) -> None:
        self.n_d = int(state["n_d"])


@dataclass
class AdaptiveSteps:
    threshold: float = 0.6
    beta: float = 0.99
    start: int = 1

    def __post_init__(self):
        if not 0.0 < self.beta < 1.0:
            raise ValueError("n_d_beta: must be in (0, 1)")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError("n_d_threshold: must be in [0, 1]")
        self._index = ladder_index(self.start)
        self._ema: float | None = None
        self._since_change = 0

    @property
    def grace(self) -> int:
        return round(2 / (1 - self.beta))

    @property
    def n_d(self) -> int:
        return ladder_value(self._index)

    @property
    def ema(self) -> float | None:
        return self._ema

    def observe(self, fake_accuracy: float) -> None:
        """Record D's accuracy on a fresh fake batch, taken just before a generator step."""
        a = float(fake_accuracy)
        self._ema = a if self._ema is None else self.beta * self._ema + (1 - self.beta) * a
        self._since_change += 1
        if self._since_change >= self.grace and self._ema <= self.threshold:
            self._index += 1
            self._since_change = 0

    def state_dict(self) -> dict:
        return {"index": self._index, "ema": self._ema, "since_change": self._since_change}

    def load_state_dict(self, state: dict) -> None:
        self._index = int(state["index"])
        self._ema = None if state["ema"] is None else float(state["ema"])
        self._since_change = int(state["since_change"])
