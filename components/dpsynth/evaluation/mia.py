"""Empirical membership inference against the released generator: GAN-Leaks' full black-box
attack (Chen, Yu, Zhang, Fritz 2020). The attacker draws samples from the generator and scores a
record by its distance to the nearest sample of the record's class; training records of a
generator that memorized lie closer than records it never saw.

Reported: ROC AUC of that score separating held-in (training) from held-out records, and the
true-positive rate at 1% false positives. The attack reads training records, so its numbers
are statistics of sensitive data: an auditor's diagnostic ("internal"), not covered by the
release's (ε, δ). An AUC near ½ is what DP predicts; DP bounds the AUC of *any* attack by a
function of (ε, δ), so a low AUC here is evidence, not proof.
"""

from __future__ import annotations

import numpy as np
import torch

from dpsynth.data import ImageDataset


def nearest_distances(queries: torch.Tensor, query_labels: torch.Tensor, samples: torch.Tensor,
                      sample_labels: torch.Tensor, *, chunk: int = 1024) -> torch.Tensor:
    """For each query (N×D) the L2 distance to its nearest sample (M×D) of the same label."""
    out = torch.full((len(queries),), float("inf"), dtype=torch.float64)
    for k in torch.unique(query_labels):
        q_idx = (query_labels == k).nonzero().view(-1)
        pool = samples[sample_labels == k]
        if len(pool) == 0:
            continue
        for part in q_idx.split(chunk):
            out[part] = torch.cdist(queries[part].double(), pool.double()).min(1).values
    return out


def roc(members: np.ndarray, nonmembers: np.ndarray, *, fpr: float = 0.01) -> dict:
    """AUC of ``score`` (higher: more likely a member) and the TPR at ``fpr`` false positives."""
    from sklearn.metrics import roc_auc_score, roc_curve

    y = np.concatenate([np.ones(len(members)), np.zeros(len(nonmembers))])
    s = np.concatenate([members, nonmembers])
    fprs, tprs, _ = roc_curve(y, s)
    return {"auc": float(roc_auc_score(y, s)), "tpr_at_1pct_fpr": float(tprs[fprs <= fpr].max())}


def attack(samples: ImageDataset, *, members: ImageDataset, nonmembers: ImageDataset) -> dict:
    """GAN-Leaks full black-box on ``members`` (held-in) vs ``nonmembers`` (held-out), with the
    generated ``samples`` (labelled) as the attacker's view of the generator."""
    flat = lambda ds: ds.to_tensors()[0].reshape(len(ds), -1)  # noqa: E731
    s_x, s_y = flat(samples), torch.as_tensor(samples.labels)
    d_in = nearest_distances(flat(members), torch.as_tensor(members.labels), s_x, s_y).numpy()
    d_out = nearest_distances(flat(nonmembers), torch.as_tensor(nonmembers.labels), s_x, s_y).numpy()
    return {**roc(-d_in, -d_out),
            "attack": "GAN-Leaks full black-box: L2 distance to the nearest generated sample of the record's class",
            "records": {"held_in": len(members), "held_out": len(nonmembers), "generated": len(samples)},
            "mean_distance": {"held_in": float(d_in.mean()), "held_out": float(d_out.mean())}}
