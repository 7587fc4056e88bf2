"""The secret randomness of a mechanism: its Gaussian noise, Poisson masks, shard and client choice.

A DP guarantee holds only while the mechanism's coins are unknown to the adversary: anyone who
can replay the noise can subtract it (ε = ∞). So every run draws its mechanism seed from the
operating system's CSPRNG (:func:`secret_seed`), never from ``train.seed``, a config, a form or
anything logged. ``train.seed`` fixes only initialisation and latents / fake samples.

The seed itself is never stored. Checkpoints (sensitive zone) hold the generator's *state*
(:meth:`MechanismRandomness.state_dict`), so an exact resume continues the same stream.

``secure_mode`` (``privacy.secure_mode``, as Opacus' ``secure_mode``): torch's generators are not
cryptographically secure (CPU: MT19937, CUDA: Philox), and a single floating-point Gaussian draw
leaks through its representation (Mironov 2012; Haney et al. 2022, arXiv:2107.10138). In secure
mode every draw (one per call: a step's noise, a step's mask, a shard choice)

* reseeds the generator from 63 fresh bits of ``os.urandom`` (via :mod:`secrets`), so no state
  recovered from earlier outputs predicts later ones, and
* for Gaussian noise, discards one sample and returns the sum of 4 standard normal draws / 2
  (still exactly N(0, 1)), Opacus' ``_generate_noise`` defence with n = 2 (attack cost 2^159).

Secure mode cannot resume the same stream (it has no stream to resume); a resumed run simply
continues with fresh secret coins, which is equally private.
"""

from __future__ import annotations

import secrets

import torch


def secret_seed() -> int:
    """63 bits from the OS CSPRNG (``os.urandom``): a mechanism seed nobody can know or replay."""
    return secrets.randbits(63)


class MechanismRandomness:
    """The coins of one mechanism, on ``device``.

    ``seed`` is for tests that must replay a mechanism (e.g. two code paths compared bit for bit);
    it is deliberately not reachable from the config or the command line. None: :func:`secret_seed`.

    >>> r = MechanismRandomness(seed=1)
    >>> r.poisson_mask(5, 1.0).tolist(), r.standard_normal((2,)).shape
    ([True, True, True, True, True], torch.Size([2]))
    """

    def __init__(self, *, device: str | torch.device = "cpu", secure_mode: bool = False, seed: int | None = None):
        self.device = torch.device(device)
        self.secure_mode = bool(secure_mode)
        self._generator = torch.Generator(device=self.device).manual_seed(secret_seed() if seed is None else seed)

    def _fresh(self) -> torch.Generator:
        if self.secure_mode:
            self._generator.manual_seed(secret_seed())
        return self._generator

    def standard_normal(self, shape, *, dtype: torch.dtype | None = None) -> torch.Tensor:
        """i.i.d. N(0, 1) of ``shape`` (callers scale by the noise std)."""
        g = self._fresh()
        if not self.secure_mode:
            return torch.randn(shape, device=self.device, dtype=dtype, generator=g)
        torch.randn((1,), device=self.device, generator=g)  # discard the first sample (as Opacus)
        total = torch.randn(shape, device=self.device, dtype=dtype, generator=g)
        for _ in range(3):
            total += torch.randn(shape, device=self.device, dtype=dtype, generator=g)
        return total / 2

    def uniform(self, shape) -> torch.Tensor:
        """i.i.d. U[0, 1) of ``shape`` (dp-GAN's per-unit interpolation weights)."""
        return torch.rand(shape, device=self.device, generator=self._fresh())

    def poisson_mask(self, n: int, rate: float) -> torch.Tensor:
        """Poisson sampling: each of ``n`` records independently with probability ``rate`` (bool[n])."""
        return torch.rand(n, device=self.device, generator=self._fresh()) < rate

    def choice(self, k: int) -> int:
        """A uniform index in [0, k) (GS-WGAN's shard, federated GS-WGAN's client)."""
        return int(torch.randint(k, (1,), device=self.device, generator=self._fresh()))

    def state_dict(self) -> dict:
        """The generator's state, for checkpoints (sensitive zone only)."""
        return {"state": self._generator.get_state(), "secure_mode": self.secure_mode}

    def load_state_dict(self, state: dict) -> None:
        self._generator.set_state(state["state"])
