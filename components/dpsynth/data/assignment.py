"""Where a record belongs — a training shard, held out, or public — from its id and the partition key alone.

``h = HMAC-SHA256(partition.key, record_id)``: the first 8 bytes of ``h`` as a fraction of 2⁶⁴ below
``data.heldout_fraction`` hold the record out, in [heldout_fraction, heldout_fraction + public_fraction)
make it public, otherwise the next 8 bytes mod K name its shard (see ``dpsynth partition``). Data-
independent, so neighbouring datasets differ in one shard only.
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np

from dpsynth.data.dataset import ImageDataset
from dpsynth.errors import ConfigError, DatasetError

HELDOUT = -1
PUBLIC = -2


def assign(record_ids: list[str], *, key: str, heldout_fraction: float, num_shards: int,
           public_fraction: float = 0.0) -> np.ndarray:
    """Each record's shard in ``[0, num_shards)``, or ``HELDOUT`` (-1), or ``PUBLIC`` (-2).

    >>> assign(["a", "b", "c"], key="k", heldout_fraction=0.0, num_shards=1).tolist()
    [0, 0, 0]
    """
    out = np.empty(len(record_ids), np.int64)
    secret = key.encode()
    for i, rid in enumerate(record_ids):
        h = hmac.new(secret, rid.encode(), hashlib.sha256).digest()
        u = int.from_bytes(h[:8], "big") / 2**64
        if u < heldout_fraction:
            out[i] = HELDOUT
        elif u < heldout_fraction + public_fraction:
            out[i] = PUBLIC
        else:
            out[i] = int.from_bytes(h[8:16], "big") % num_shards
    return out


def public_mask(ds: ImageDataset, cfg) -> np.ndarray:
    """Which records of ``ds`` are public under ``cfg`` (the separate source's records, the public split,
    or the keyed-hash band)."""
    if cfg.data.public_source is not None:
        from dpsynth.data.public import load_public_source

        return np.isin(np.array(ds.record_ids, dtype=object),
                       np.array(load_public_source(cfg.data.public_source).record_ids, dtype=object))
    if cfg.data.public_split is not None:
        return np.array([s == cfg.data.public_split for s in (ds.splits or [None] * len(ds))], dtype=bool)
    if cfg.data.public_fraction == 0:
        return np.zeros(len(ds), dtype=bool)
    return assign(ds.record_ids, key=partition_key(cfg), heldout_fraction=cfg.data.heldout_fraction,
                  num_shards=cfg.partition.num_shards, public_fraction=cfg.data.public_fraction) == PUBLIC


DEMO_KEY = "dpsynth-partition-v1"  # the key the shipped configs set: the bundled MNIST demo's, public


KEY_ENV = "DPSYNTH_PARTITION_KEY"  # the platform's key: a Kubernetes Secret given to the partition pod only
REQUIRE_ENV = "DPSYNTH_REQUIRE_PARTITION_KEY"  # "true" on a cluster: the key must come from that Secret


def with_platform_key(cfg):
    """``cfg`` with ``partition.key`` from ``$DPSYNTH_PARTITION_KEY`` when that is set (the platform's Secret: on a
    cluster the key never passes through a config, a form or a ConfigMap). With ``$DPSYNTH_REQUIRE_PARTITION_KEY``
    true (the orchestrators set it on the partition pod), a key missing from the environment, or the demo's public
    :data:`DEMO_KEY`, is refused: a real population's records would be assigned by a key anyone can read."""
    import dataclasses
    import os

    key = os.environ.get(KEY_ENV, "").strip()
    if os.environ.get(REQUIRE_ENV, "").lower() == "true":
        if not key:
            raise ConfigError(f"partition.key: this platform sets it from its Secret ({KEY_ENV}, the chart's "
                              "partitionKey.secret), which the partition pod did not get: create that Secret "
                              "(docs/cluster.md, Install)")
        if key == DEMO_KEY:
            raise ConfigError(f"partition.key: the Secret's {KEY_ENV} is {DEMO_KEY!r}, the bundled MNIST demo's "
                              "public key: set a secret key of your own for this population")
    if not key:
        return cfg
    return dataclasses.replace(cfg, partition=dataclasses.replace(cfg.partition, key=key))


def partition_key(cfg) -> str:
    """``partition.key``, which the operator must set: there is no default (the shipped demo configs set
    :data:`DEMO_KEY`, public). ConfigError naming the field when it is unset."""
    if not cfg.partition.key:
        raise ConfigError("partition.key: not set. It decides which shard each record joins and which records are "
                          "held out; set a secret key of your own for a real population, fixed for that population "
                          f"(the shipped configs set {DEMO_KEY!r}, the bundled MNIST demo's key, which is public)")
    return cfg.partition.key


def require_public(cfg, ds: ImageDataset, *, what: str) -> None:
    """Refuse ``ds`` unless the config declares public data and every record of ``ds`` is public
    under it (the partition's keyed hash, or the public split): non-private training on it is free
    only because it is public."""
    from dpsynth.data.public import declared

    d = cfg.data
    if not declared(cfg):
        raise ConfigError(f"data.public_source: {what} trains without privacy and needs public records; "
                          "declare them with data.public_source (e.g. sklearn:digits) or data.public_split")
    if len(ds) == 0:
        raise DatasetError(f"{what}: the public dataset is empty")
    private = int((~public_mask(ds, cfg)).sum())
    if private:
        field = ("data.public_source" if d.public_source is not None else
                 "data.public_split" if d.public_split is not None else "data.public_fraction")
        raise DatasetError(f"{field}: {private} of {len(ds)} records given to {what} are not public under this "
                           "config; refusing to train without privacy on private records")


def check_given(cfg, public: ImageDataset, private: ImageDataset) -> ImageDataset:
    """``public``, once what can be checked of public records a trainer is given beside its private ones is
    checked (the caller vouches that they are the partition's public output: the key that would let us recompute
    it is redacted)."""
    from dpsynth.data.public import declared

    if not declared(cfg):
        raise ConfigError("data.public_source: public records given, but the config declares none public")
    overlap = set(public.record_ids) & set(private.record_ids)
    if overlap:
        raise DatasetError(f"data.public_fraction: {len(overlap)} public records are also private training records")
    return public
