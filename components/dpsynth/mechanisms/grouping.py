"""Parameter grouping and adaptive clipping bounds of dp-GAN (Zhang, Ji & Wang 2018, §4.1–4.2).

The critic's parameter tensors are split into k groups; each example's gradient is clipped
group by group to the group's bound c_j and each group gets noise σ·c_j
(:class:`~dpsynth.mechanisms.dpsgd.GradientSanitizer`). Strategies:

* ``global``: one group (plain DP-SGD);
* ``weight_bias``: all weights in one group, all biases in another;
* ``per_layer``: one group per module (a layer's weight and bias together);
* ``clustering``: Algorithm 2 — start with one group per parameter *tensor* (the paper's
  "parameter"; per-scalar clustering is quadratic in millions of scalars), repeatedly merge
  the two groups whose bounds are closest, the merged bound being √(c² + c'²), until k remain.

Adaptive clipping (§4.2): a tensor's bound is the mean, over a batch of *public* examples,
of the norm of that example's gradient restricted to the tensor; a group's bound is the mean
per-example norm of the gradient restricted to the group. :func:`public_bounds` sees only
the per-example gradients it is given, which the trainer computes on public records alone.

Privacy: the k groups of one step form one Gaussian release of noise multiplier σ/√k
(``fold_releases``); the grouping and the bounds are functions of public data and of the
already-privatized critic, so choosing them costs nothing.

>>> [(members, round(c, 4)) for members, c in merge_closest([1.0, 1.1, 5.0], k=2)]
[([0, 1], 1.4866), ([2], 5.0)]
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

STRATEGIES = ("global", "weight_bias", "per_layer", "clustering")


def merge_closest(bounds: Sequence[float], *, k: int) -> list[tuple[list[int], float]]:
    """Algorithm 2 (Weight-Clustering): greedily merge the two groups with the most similar bounds.

    Returns k groups (fewer only when there are fewer items) as ``(member indices, bound)``,
    members ascending, groups ordered by their smallest member. Ties: the pair with the smallest
    indices merges first.
    """
    if k < 1:
        raise ValueError(f"k: must be >= 1, got {k}")
    if any(not (c >= 0 and math.isfinite(c)) for c in bounds):
        raise ValueError("bounds: every bound must be finite and >= 0")
    groups: list[tuple[list[int], float]] = [([i], float(c)) for i, c in enumerate(bounds)]
    while len(groups) > k:
        best = None
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                gap = abs(groups[a][1] - groups[b][1])
                if best is None or gap < best[0]:
                    best = (gap, a, b)
        _, a, b = best
        merged = (sorted(groups[a][0] + groups[b][0]), math.hypot(groups[a][1], groups[b][1]))
        groups = [g for i, g in enumerate(groups) if i not in (a, b)] + [merged]
    return sorted(groups, key=lambda g: g[0][0])


def _layer(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def _is_bias(name: str) -> bool:
    return name.rsplit(".", 1)[-1] == "bias"


def fixed_groups(names: Sequence[str], *, strategy: str) -> list[list[str]]:
    """The groups of the strategies that do not look at gradients (all but ``clustering``)."""
    names = list(names)
    if strategy == "global":
        return [names]
    if strategy == "weight_bias":
        weights = [n for n in names if not _is_bias(n)]
        biases = [n for n in names if _is_bias(n)]
        return [g for g in (weights, biases) if g]
    if strategy == "per_layer":
        layers: dict[str, list[str]] = {}
        for n in names:
            layers.setdefault(_layer(n), []).append(n)
        return list(layers.values())
    if strategy == "clustering":
        raise ValueError("grouping: 'clustering' needs per-tensor bounds; use cluster_groups")
    raise ValueError(f"grouping: must be one of {', '.join(STRATEGIES)}, got {strategy!r}")


def num_groups(names: Sequence[str], *, strategy: str, k: int) -> int:
    """How many groups ``strategy`` makes of these parameter tensors (fixed for a model)."""
    if strategy == "clustering":
        return min(k, len(names))
    return len(fixed_groups(names, strategy=strategy))


def per_example_norms(grads: Mapping[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    """(batch,) L2 norms of each example's gradient restricted to the tensors ``names``."""
    sq = [torch.linalg.vector_norm(grads[n].reshape(grads[n].shape[0], -1), dim=1) ** 2 for n in names]
    return torch.stack(sq).sum(0).sqrt()


@torch.no_grad()
def public_bounds(grads: Mapping[str, torch.Tensor], groups: Sequence[Sequence[str]], *,
                  floor: float = 1e-6) -> list[float]:
    """Each group's bound: the mean per-example norm of the group's gradient over the public batch.

    ``grads`` maps a parameter name to its per-example gradients (batch first) on public
    examples. A floor keeps every bound positive (a group whose gradients all vanish).
    """
    return [max(float(per_example_norms(grads, g).mean()), floor) for g in groups]


def cluster_groups(grads: Mapping[str, torch.Tensor], names: Sequence[str], *, k: int,
                   floor: float = 1e-6) -> tuple[list[list[str]], list[float]]:
    """Algorithm 2 on per-tensor public bounds: k groups of tensor names and their merged bounds."""
    tensor_bounds = public_bounds(grads, [[n] for n in names], floor=floor)
    clusters = merge_closest(tensor_bounds, k=k)
    return [[names[i] for i in members] for members, _ in clusters], [c for _, c in clusters]
