"""``dpsynth warmstart``: non-private pre-training, for the methods that warm-start.

GS-WGAN and DPAC pre-train one discriminator per shard, dp-GAN (Zhang) pre-trains G and D on
public data; those methods add a function to ``WARM_STARTS``. Their outputs stay in the
sensitive zone, which is the only reason the stage consumes ε = 0. DPGAN does not warm-start:
the stage records that in its manifest and does nothing else.
"""

from __future__ import annotations

from typing import Callable

from dpsynth.stages import common, manifest

STAGE = "warmstart"
SECTIONS = ("data", "partition", "train")

# method -> fn(ctx, partition_manifest, run) -> (outputs, details); outputs in the sensitive zone.
WARM_STARTS: dict[str, Callable] = {}


def run(ctx: common.StageContext) -> common.Outcome:
    cfg = ctx.cfg
    partition, partition_entry = common.upstream(ctx, "partition")
    inputs = [partition_entry]
    fp = common.fingerprint(cfg, SECTIONS)
    if (reused := common.reuse(ctx, STAGE, fingerprint=fp, inputs=inputs)) is not None:
        return reused
    method = cfg.train.method
    with common.child_run(ctx, STAGE) as run:
        if method in WARM_STARTS:
            outputs, details = WARM_STARTS[method](ctx, partition, run)
            details = {"performed": True, **details}
        else:
            outputs, details = [], {"performed": False, "reason": f"method {method!r} does not warm-start"}
        return common.finish(
            ctx, STAGE, run, fingerprint=fp, dataset_sha256=partition["dataset_sha256"], inputs=inputs,
            outputs=outputs, details=details,
            privacy=manifest.no_privacy(delta=cfg.privacy.delta, note="non-private, so its outputs never "
                                        "leave the sensitive zone"),
        )
