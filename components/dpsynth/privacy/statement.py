"""What a release's (ε, δ) means, in words the audit prints: adjacency, noise convention, assumptions.

Every method states, for the audit (``audit.md``), the release record and the MLflow tags:

* ``adjacency`` — the neighbouring relation the ε holds for (add/remove one record, or replace one),
  with the sampling rate that matches it;
* ``noise`` — the σ convention: the noise standard deviation in units of the clip norm C (σ·C) and
  the sensitivity the accountant charges (C, or 2C for a replaced release);
* ``assumptions`` — what the account assumes beyond the trace (GS-WGAN: the shard-state assumption), and for
  every method that n and the label set are public and that the settings were not tuned on the sensitive
  records (:data:`PUBLIC_FACTS`, :data:`TUNING`);
* ``accounts`` — other guarantees stated beside the main one (the account with the shard choice
  revealed; federated: the guarantee against the server);
* ``unprotected`` — records used without privacy, when the operator acknowledged it (``None``
  otherwise).

:func:`revealed_choice_account` is the account of a shard-sampled mechanism against an adversary who
sees which shard each iteration drew (GS-WGAN's server, or anyone, without the shard-state assumption).
"""

from __future__ import annotations

import math

from dpsynth.privacy.events import MechanismEvent, MechanismTrace

REPLACE_BY_GROUP_PRIVACY = ("replacing one record (remove one, add another) is covered by group privacy "
                            "at (2ε, (1 + e^ε)·δ)")


# What every statement assumes, whatever the method (docs/privacy.md, "What is public")
PUBLIC_FACTS = ("n and the label set are public: the number of training records n (and the counts of all and of "
                "held-out records) is published — the trace's sampling rate q = B/n and σ calibrated from n, the audit "
                "report's training_records — and the label set is the configuration's data.num_classes, not read off "
                "the data; per-shard counts and the partition key are not published. The dataset's version history "
                "is public too: whether and when the records changed (a new keyed version id in data.uri, the asset "
                "events and XCom, the retrain that runs or is skipped), so with n public a same-size edit, a "
                "replacement or a revert is visible, though not which records")
ARRIVAL = ("a record's arrival is public, like n: the import that first brought it (its privacy block), each block's "
           "import time and record count; the lifetime budget is per block, so a record's privacy loss over time is "
           "the sum over the runs that read its block, which the ledger keeps at most the block's budget "
           "(docs/privacy.md, \"Privacy blocks\")")
TUNING = ("the settings (noise, steps, networks, warm-up) were chosen outside this guarantee: a hyperparameter search "
          "on the sensitive records is not covered by it (the shipped defaults were tuned on the bundled MNIST, the "
          "records the demo trains on)")


def statement(*, adjacency: str, noise: str, assumptions=(), accounts=(), unprotected: str | None = None) -> dict:
    """A method's statement; every one also states :data:`ARRIVAL`, :data:`PUBLIC_FACTS` and :data:`TUNING`, last."""
    return {"adjacency": adjacency, "noise": noise, "assumptions": [*assumptions, ARRIVAL, PUBLIC_FACTS, TUNING],
            "accounts": list(accounts), "unprotected": unprotected}


def revealed_choice_account(event: MechanismEvent, steps: int, *, num_shards: int, delta: float,
                            prefix: tuple[MechanismEvent, ...] = ()) -> dict:
    """(ε, δ) of ``steps`` shard-sampled iterations (``event``: rate 1/K, σ_e per C, replace_one, i.e.
    sensitivity 2C) when the adversary sees each iteration's shard: no amplification by the choice.

    The shard holding the differing record is drawn m ~ Binomial(steps, 1/K) times, independently of
    the data. With probability ≥ 1 − δ/2, m ≤ m* (the binomial's upper δ/2 tail, scipy), and m
    Gaussian releases of sensitivity 2C and noise σ_e·C are m full-batch Gaussian releases of
    multiplier σ_e/2, bounded by RDP at δ/2. So the mechanism is (ε(m*), δ)-DP against that adversary.
    ``prefix``: full-batch add/remove releases before the iterations (a warm-up), composed with them.
    """
    from scipy.stats import binom

    from dpsynth.privacy.registry import get_accountant

    m = int(binom.isf(delta / 2, steps, 1 / num_shards))
    while binom.sf(m, steps, 1 / num_shards) > delta / 2:  # isf is a float search: make the tail hold
        m += 1
    trace = MechanismTrace([*prefix, *([MechanismEvent(sampling="full_batch", sample_rate=1.0,
                                                       noise_multiplier=event.noise_multiplier / 2,
                                                       sensitivity="add_remove", count=m)] if m else [])])
    eps = get_accountant("rdp").epsilon(trace, delta=delta / 2)
    return {"epsilon": eps if math.isfinite(eps) else math.inf, "delta": delta, "iterations_bound": m,
            "how": f"the record's shard is drawn at most m* = {m} of {steps} iterations except with probability "
                   f"δ/2 (Binomial({steps}, 1/{num_shards})); {m} Gaussian releases of multiplier σ_e/2 = "
                   f"{event.noise_multiplier / 2:.6g} (sensitivity 2C), RDP at δ/2"}
