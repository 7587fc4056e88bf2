"""Versioned dataset URIs for ``dpsynth data import --versioned`` (issue #34, retraining on new data).

An import to ``DST`` (e.g. ``s3://b/data/mnist.parquet``) also keeps the version, immutable, at
``<DST without .parquet>/<version>.parquet`` (``s3://b/data/mnist/<version>.parquet``), and records the newest
version in ``<DST without .parquet>/LATEST``. A version names the records' content by a keyed id: HMAC-SHA256(key,
content sha256), the key 32 random bytes kept beside the versions (``.version-key``, in the sensitive zone's storage,
made on the first import). A raw content hash in a URI, an asset event or a log would let anyone who knows the other
records test whether one is in them; the keyed id is comparable across imports to one DST and tells nothing else.

An import whose version is the newest already writes nothing and says ``"changed": false``. Whether a retrain
runs is decided against what was *released*, not against the newest import (an import whose run failed its audit
released nothing): when the sample stage releases a run trained on a version, it records that version as its
population's last release (``<DST without .parquet>/released/<population key>``, :func:`record_release`), and a
retrain's ``dpsynth pipeline start --unless-released`` opens no run and charges nothing when its version is the one
last released for its population (:func:`released`).
"""

from __future__ import annotations

import hashlib
import hmac
import os

from dpsynth import storage

KEY = ".version-key"
LATEST = "LATEST"
ID_CHARS = 32  # 128 bits of the HMAC: the version id in URIs


def keyed_version(key: bytes, sha256: str) -> str:
    """The keyed id of a content hash: HMAC-SHA256 under ``key``, so the raw hash never leaves with it."""
    return hmac.new(key, sha256.encode(), hashlib.sha256).hexdigest()


def root(dst: str) -> str:
    """Where the versions of ``dst`` are kept: ``dst`` without its ``.parquet`` suffix."""
    dst = str(dst).rstrip("/")
    return dst[: -len(".parquet")] if dst.endswith(".parquet") else dst + ".versions"


def version_id(dst: str, content_sha256: str) -> str:
    """The keyed id of records with ``content_sha256`` among ``dst``'s versions (the key made on first use)."""
    key_uri = storage.join(root(dst), KEY)
    if not storage.exists(key_uri):
        storage.write_bytes(key_uri, os.urandom(32))
    return keyed_version(storage.read_bytes(key_uri), content_sha256)[:ID_CHARS]


def uri(dst: str, version: str) -> str:
    return storage.join(root(dst), f"{version}.parquet")


def latest(dst: str) -> str | None:
    """The newest imported version of ``dst``, None before the first versioned import."""
    at = storage.join(root(dst), LATEST)
    return storage.read_bytes(at).decode().strip() or None if storage.exists(at) else None


def record(dst: str, version: str) -> None:
    storage.write_text(storage.join(root(dst), LATEST), version + "\n")


def version_of(uri: str) -> tuple[str, str] | None:
    """``(folder, version)`` when ``uri`` is a version of an import (``<folder>/<version>.parquet`` with the
    versions' key beside it), else None."""
    uri = str(uri).rstrip("/")
    name = uri.rsplit("/", 1)[-1]
    if not name.endswith(".parquet") or "/" not in uri:
        return None
    folder, version = uri[: -len(name) - 1], name[: -len(".parquet")]
    if len(version) != ID_CHARS or not storage.exists(storage.join(folder, KEY)):
        return None
    return folder, version


def _released_at(folder: str, population_id: str) -> str:
    # the population id may hold any character: its file is named by a digest of it
    return storage.join(folder, "released", hashlib.sha256(population_id.encode()).hexdigest()[:ID_CHARS])


def record_release(uri: str, population_id: str) -> str | None:
    """Record ``uri``'s version (when it is one) as the last release of ``population_id``; returns the version."""
    found = version_of(uri)
    if found is None:
        return None
    storage.write_text(_released_at(found[0], population_id), found[1] + "\n")
    return found[1]


def released(uri: str, population_id: str) -> str | None:
    """The version last released for ``population_id`` among the versions ``uri`` is one of (None: none yet, or
    ``uri`` is no version of an import)."""
    found = version_of(uri)
    return None if found is None else last_release(found[0], population_id)


def last_release(folder: str, population_id: str) -> str | None:
    """The version last released for ``population_id`` among the versions in ``folder`` (None: none yet)."""
    at = _released_at(folder, population_id)
    return (storage.read_bytes(at).decode().strip() or None) if storage.exists(at) else None


def check(uri: str, content_sha256: str) -> None:
    """Refuse (DatasetError, naming data.uri) records at a versioned URI whose content is not that version: the file
    was replaced after its import, so it is not what the asset event that named it announced. A URI that is not a
    version of an import (no ``.version-key`` beside it) is not checked."""
    from dpsynth.errors import DatasetError

    uri = str(uri).rstrip("/")
    name = uri.rsplit("/", 1)[-1]
    if not name.endswith(".parquet"):
        return
    folder, version = uri[: -len(name) - 1], name[: -len(".parquet")]
    key_uri = storage.join(folder, KEY)
    if len(version) != ID_CHARS or not storage.exists(key_uri):
        return
    if keyed_version(storage.read_bytes(key_uri), content_sha256)[:ID_CHARS] != version:
        raise DatasetError(f"data.uri: {uri} is version {version} of an import, but its records are not that "
                           "version (the file was replaced after the import); import the data again")
