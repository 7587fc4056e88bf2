"""Where bytes live: local paths (or ``file://``) and ``s3://bucket/key``, behind one interface.

Every write is atomic. Locally, data goes to a temporary sibling that is renamed into place;
on S3, it is buffered in a local temporary file and uploaded with boto3's managed transfer once
the writing block succeeds (a multipart upload above ``TRANSFER_CONFIG.multipart_threshold``,
which S3 completes atomically). Either way an output appears whole or not at all.

S3 credentials, region and endpoint come from boto3's standard settings (``AWS_ENDPOINT_URL_S3``,
``AWS_ENDPOINT_URL``, the AWS config file). When neither endpoint variable is set,
``MLFLOW_S3_ENDPOINT_URL`` is used, so one S3-compatible server configured for MLflow serves dpsynth too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import IO, Iterator

AWS_ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # boto3 reads these itself
MLFLOW_ENDPOINT_VAR = "MLFLOW_S3_ENDPOINT_URL"
MiB = 1024 * 1024
# Multipart above 64 MiB, in 64 MiB parts: S3 allows 10,000 parts, so objects up to 625 GiB
# (a single PutObject stops at 5 GiB).
MULTIPART_THRESHOLD = 64 * MiB
MULTIPART_CHUNKSIZE = 64 * MiB


def transfer_config():
    """boto3's ``TransferConfig`` for the managed uploads, downloads and copies."""
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_CHUNKSIZE)


# --- URIs -------------------------------------------------------------------------------------


def is_remote(uri: str | os.PathLike) -> bool:
    return "://" in str(uri) and not str(uri).startswith("file://")


def _is_s3(uri: str | os.PathLike) -> bool:
    if str(uri).startswith("s3:/") and not str(uri).startswith("s3://"):
        raise ValueError(f"{uri}: not a valid URI (an s3:// URI joined with pathlib? use storage.join)")
    if is_remote(uri) and not str(uri).startswith("s3://"):
        raise ValueError(f"{uri}: unsupported URI scheme (use a local path, file:// or s3://)")
    return is_remote(uri)


def _bucket_key(uri: str, *, object_key: bool = True) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``; the key may be empty only when ``object_key`` is False."""
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket:
        raise ValueError(f"{uri}: S3 URI has no bucket (expected s3://bucket/key)")
    if object_key and (not key or key.endswith("/")):
        raise ValueError(f"{uri}: S3 URI names no object (expected s3://bucket/key)")
    return bucket, key


def local_path(uri: str | os.PathLike) -> Path:
    uri = str(uri)
    if _is_s3(uri):
        raise ValueError(f"{uri}: an s3:// URI has no local path (use storage.read_bytes or open_input)")
    return Path(uri[len("file://"):] if uri.startswith("file://") else uri)


def join(base_uri: str | os.PathLike, *parts: str) -> str:
    """``base/part/...`` for local paths and URIs alike (pathlib would turn ``s3://`` into ``s3:/``).

    Parts are always relative: a leading ``/`` does not restart the path as in ``os.path.join``.
    """
    uri = str(base_uri)
    if _is_s3(uri):
        _bucket_key(uri, object_key=False)
    for part in parts:
        if part:
            uri = uri.rstrip("/") + "/" + str(part).lstrip("/")
    return uri


# --- S3 client --------------------------------------------------------------------------------


def endpoint_url() -> str | None:
    """The endpoint to give boto3 explicitly: ``MLFLOW_S3_ENDPOINT_URL`` when boto3's own
    ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` are unset (which boto3 then applies itself), else None."""
    if any(os.environ.get(v) for v in AWS_ENDPOINT_VARS):
        return None
    return os.environ.get(MLFLOW_ENDPOINT_VAR) or None


_client_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _client_for(endpoint: str | None, custom: bool, pid: int):  # pid: a forked child must not share connections
    import boto3
    from botocore.config import Config

    # S3-compatible servers (MinIO, moto) behind a custom endpoint want path-style addressing.
    config = Config(s3={"addressing_style": "path"}) if custom else None
    with _client_lock:  # creating clients from boto3's default session is not thread-safe
        return boto3.client("s3", endpoint_url=endpoint, config=config)


def _client():
    custom = tuple(os.environ.get(v) for v in (*AWS_ENDPOINT_VARS, MLFLOW_ENDPOINT_VAR))  # part of the cache key
    return _client_for(endpoint_url(), custom if any(custom) else (), os.getpid())


@contextlib.contextmanager
def _s3_errors(uri: str) -> Iterator[None]:
    """Missing buckets and objects become FileNotFoundError naming ``uri``."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import ClientError

    try:
        yield
    except (ClientError, S3UploadFailedError) as exc:
        error = exc if isinstance(exc, ClientError) else exc.__context__  # a managed upload wraps the ClientError
        if not isinstance(error, ClientError):
            raise
        code = error.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound"):
            what = "bucket does not exist" if code == "NoSuchBucket" else "no such object"
            raise FileNotFoundError(f"{uri}: {what}") from None
        raise


# --- reading ----------------------------------------------------------------------------------


def exists(uri: str | os.PathLike) -> bool:
    """Whether a local file/directory or an S3 object exists (an S3 key prefix does not count)."""
    if not _is_s3(uri):
        return local_path(uri).exists()
    bucket, key = _bucket_key(str(uri))
    try:
        with _s3_errors(str(uri)):
            _client().head_object(Bucket=bucket, Key=key)
    except FileNotFoundError:
        return False
    return True


def read_bytes(uri: str | os.PathLike) -> bytes:
    if not _is_s3(uri):
        try:
            return local_path(uri).read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(f"{uri}: no such file") from None
    bucket, key = _bucket_key(str(uri))
    with _s3_errors(str(uri)):
        return _client().get_object(Bucket=bucket, Key=key)["Body"].read()


@contextlib.contextmanager
def open_input(uri: str | os.PathLike) -> Iterator[IO[bytes]]:
    """A seekable binary file to read ``uri`` from (for pyarrow, numpy, torch); an S3 object is
    downloaded into an anonymous temporary file first."""
    if not _is_s3(uri):
        try:
            fh = open(local_path(uri), "rb")
        except FileNotFoundError:
            raise FileNotFoundError(f"{uri}: no such file") from None
        with fh:
            yield fh
        return
    bucket, key = _bucket_key(str(uri))
    with tempfile.TemporaryFile() as fh:
        with _s3_errors(str(uri)):
            _client().download_fileobj(bucket, key, fh, Config=transfer_config())
        fh.seek(0)
        yield fh


def sha256(uri: str | os.PathLike) -> str:
    """Hex SHA-256 of the contents of ``uri``."""
    with open_input(uri) as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def list_uris(prefix_uri: str | os.PathLike) -> list[str]:
    """Every file (object) under the directory (key prefix) ``prefix_uri``, recursively, sorted.

    ``prefix_uri`` names a directory: ``s3://b/run1`` lists ``s3://b/run1/...``, not ``s3://b/run10``.
    A prefix with nothing under it gives ``[]``.
    """
    prefix_uri = str(prefix_uri)
    if not _is_s3(prefix_uri):
        root = local_path(prefix_uri)
        files = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
        return sorted(join(prefix_uri, f) for f in files)
    bucket, key = _bucket_key(prefix_uri, object_key=False)
    if key and not key.endswith("/"):
        key += "/"
    uris = []
    with _s3_errors(prefix_uri):
        for page in _client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            uris += [f"s3://{bucket}/{obj['Key']}" for obj in page.get("Contents", [])]
    return sorted(uris)


# --- writing ----------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_write(uri: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file for ``uri``; when the block succeeds, move it into place (locally:
    fsync, chmod 0644, rename; on S3: a managed upload, multipart when large). When the block
    raises, nothing is written and the temporary file is removed."""
    if _is_s3(uri):
        bucket, key = _bucket_key(str(uri))
        directory = None  # the system temp dir
    else:
        path = local_path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        directory = path.parent
    name = Path(str(uri)).name
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as fh:
            yield fh
            fh.flush()
            if directory is not None:
                os.fsync(fh.fileno())
        if directory is None:
            with _s3_errors(str(uri)):
                _client().upload_file(tmp, bucket, key, Config=transfer_config())
        else:
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are read by other stages and users
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_bytes(uri: str | os.PathLike, data: bytes) -> None:
    with atomic_write(uri, "wb") as fh:
        fh.write(data)


def write_text(uri: str | os.PathLike, text: str) -> None:
    with atomic_write(uri, "w") as fh:
        fh.write(text)


def copy(src_uri: str | os.PathLike, dst_uri: str | os.PathLike) -> None:
    """Copy one file/object, atomically, between any two of local and S3 (S3 to S3 server-side)."""
    if _is_s3(src_uri) and _is_s3(dst_uri):
        (src_bucket, src_key), (bucket, key) = _bucket_key(str(src_uri)), _bucket_key(str(dst_uri))
        with _s3_errors(str(src_uri)):
            _client().head_object(Bucket=src_bucket, Key=src_key)  # so a missing source is named
        with _s3_errors(str(dst_uri)):  # server-side; multipart (UploadPartCopy) when large
            _client().copy({"Bucket": src_bucket, "Key": src_key}, bucket, key, Config=transfer_config())
        return
    with open_input(src_uri) as src, atomic_write(dst_uri, "wb") as dst:
        shutil.copyfileobj(src, dst)


def delete(uri: str | os.PathLike) -> None:
    """Remove one file/object; removing one that does not exist is not an error."""
    if not _is_s3(uri):
        local_path(uri).unlink(missing_ok=True)
        return
    bucket, key = _bucket_key(str(uri))
    with _s3_errors(str(uri)):
        _client().delete_object(Bucket=bucket, Key=key)


# --- zones ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Zones:
    """Base URIs of the two storage zones: *sensitive* (raw data, shards, discriminators,
    checkpoints) and *release* (audited generator, synthetic data, reports). They must not
    overlap, so a URI is in at most one zone and writes into release can be checked."""

    sensitive: str
    release: str

    def __post_init__(self) -> None:
        s, r = _zone_base(self.sensitive), _zone_base(self.release)
        if s.startswith(r) or r.startswith(s):
            raise ValueError(f"zones overlap: sensitive {self.sensitive}, release {self.release}")

    @classmethod
    def from_root(cls, root_uri: str | os.PathLike) -> Zones:
        return cls(sensitive=join(root_uri, "sensitive"), release=join(root_uri, "release"))

    def zone_of(self, uri: str | os.PathLike) -> str | None:
        """``"sensitive"``, ``"release"`` or None for a URI in neither zone."""
        target = _zone_base(uri)
        for zone in ("sensitive", "release"):
            if target.startswith(_zone_base(getattr(self, zone))):
                return zone
        return None


def _zone_base(uri: str | os.PathLike) -> str:
    """A comparable form of ``uri`` ending in ``/``: S3 as is, local paths absolute."""
    text = str(uri) if _is_s3(uri) else os.path.abspath(local_path(uri))
    return text.rstrip("/") + "/"
