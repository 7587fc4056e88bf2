"""Quality scores from a classifier's outputs: the Inception Score (Salimans et al. 2016, as
GS-WGAN supp. C.3 and dp-GAN §5.3 compute it with a classifier trained on the real dataset)
and dp-GAN's Jensen–Shannon score for unlabeled generation (Zhang et al. §5.3, Eq. 5).
"""

from __future__ import annotations

import numpy as np

EPS = 1e-12


def inception_score(probabilities: np.ndarray, *, splits: int = 10) -> tuple[float, float]:
    """exp(E_x KL(p(y|x) ‖ p(y))) over ``splits`` equal chunks of the N×K class probabilities of
    generated samples: the mean and standard deviation over chunks."""
    p = np.asarray(probabilities, dtype=np.float64)
    splits = max(1, min(splits, len(p)))
    scores = []
    for part in np.array_split(p, splits):
        marginal = part.mean(0, keepdims=True)
        kl = (part * (np.log(part + EPS) - np.log(marginal + EPS))).sum(1)
        scores.append(float(np.exp(kl.mean())))
    return float(np.mean(scores)), float(np.std(scores))


def bernoulli_js_score(p_real: np.ndarray, *, clip: float = 1e-6) -> float:
    """dp-GAN's s(G) = ½ KL(Pr(y|x) ‖ B₀.₅) + ½ KL(B₀.₅ ‖ Pr(y|x)), averaged over samples, where
    Pr(y|x) is Bernoulli(``p_real``): 0 when a discriminator cannot tell, large when it can.
    (The paper calls it a Jensen–Shannon score; its formula is this symmetrized KL.)"""
    p = np.clip(np.asarray(p_real, dtype=np.float64), clip, 1 - clip)
    kl_pb = p * np.log(2 * p) + (1 - p) * np.log(2 * (1 - p))
    kl_bp = 0.5 * np.log(0.5 / p) + 0.5 * np.log(0.5 / (1 - p))
    return float(np.mean(0.5 * kl_pb + 0.5 * kl_bp))


def js_score(real: np.ndarray, generated: np.ndarray, *, seed: int) -> dict:
    """Train a discriminator D' (logistic regression on standardized features) on half of an equal
    number of real and generated records, then score D'(x) on the other half of the generated
    ones. Equal numbers, so that an undecided D' says ½."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(seed)
    n = min(len(real), len(generated))
    if n < 4:
        raise ValueError(f"JS score: needs at least 4 real and 4 generated records, got {len(real)} and {len(generated)}")
    r = np.asarray(real)[rng.permutation(len(real))[:n]]
    g = np.asarray(generated)[rng.permutation(len(generated))[:n]]
    half = n // 2
    x = np.concatenate([r[:half], g[:half]])
    y = np.concatenate([np.ones(half), np.zeros(half)])
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000, random_state=seed)).fit(x, y)
    p_real = model.predict_proba(g[half:])[:, 1]
    return {"js_score": bernoulli_js_score(p_real), "records": {"real": half, "generated_fit": half,
                                                                 "generated_scored": n - half}}
