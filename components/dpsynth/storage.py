"""Where bytes live: local paths (or ``file://``) and object stores — ``s3://``, ``gs://`` and
``abfs://`` (``abfss://``) — behind one interface.

Object stores go through ``pyarrow.fs``, Arrow's filesystems for S3, Google Cloud Storage and Azure
(ADLS Gen2 / Blob), one ``FileSystem`` per scheme: the calls below are the same for all three, and
nothing here is written per store. (fsspec's S3 backend, s3fs, needs an aiobotocore that pins an older
botocore than the one this project locks, so it is not used.)

Every write is atomic. Locally, data goes to a temporary sibling that is renamed into place; to an
object store, it is buffered in a local temporary file and uploaded once the writing block succeeds
(on S3 a multipart upload in Arrow's 10 MiB parts, which S3 completes atomically). Either way an
output appears whole or not at all.

Credentials come from each store's standard chain: for S3 the AWS SDK's (environment, config file,
web identity / IRSA, instance metadata); for GCS Google's application-default credentials (workload
identity, ``GOOGLE_APPLICATION_CREDENTIALS``); for Azure ``AZURE_STORAGE_ACCOUNT_KEY`` or the default
Azure credential, with the account named in the URI (``abfs://container@account.dfs.core.windows.net/key``).
The S3 endpoint is ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, else ``MLFLOW_S3_ENDPOINT_URL``
(so one S3-compatible server configured for MLflow serves dpsynth too), else AWS itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator

AWS_ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # the AWS SDKs' standard settings, in precedence
MLFLOW_ENDPOINT_VAR = "MLFLOW_S3_ENDPOINT_URL"
REMOTE_SCHEMES = ("s3", "gs", "abfs", "abfss")
MiB = 1024 * 1024
S3_COPY_OBJECT_LIMIT = 5 * 1024 * MiB  # S3's CopyObject copies up to 5 GiB server-side; larger ones stream


# --- URIs -------------------------------------------------------------------------------------


def is_remote(uri: str | os.PathLike) -> bool:
    return "://" in str(uri) and not str(uri).startswith("file://")


def _scheme(uri: str | os.PathLike) -> str | None:
    """The object store's scheme of ``uri``, or None for a local path / ``file://``; a malformed or
    unsupported URI raises ValueError naming it."""
    text = str(uri)
    mangled = re.match(r"^([a-z0-9]+):/(?!/)", text)
    if mangled and mangled[1] in REMOTE_SCHEMES:
        raise ValueError(f"{uri}: not a valid URI (a {mangled[1]}:// URI joined with pathlib? use storage.join)")
    if not is_remote(text):
        return None
    scheme = text.partition("://")[0]
    if scheme not in REMOTE_SCHEMES:
        raise ValueError(f"{uri}: unsupported URI scheme (use a local path, file://, s3://, gs:// or abfs://)")
    return scheme


def _bucket_key(uri: str, *, object_key: bool = True) -> tuple[str, str, str]:
    """``s3://bucket/key`` -> ``("s3", "bucket", "key")``; the key may be empty only when ``object_key`` is False."""
    scheme = _scheme(uri)
    bucket, _, key = uri[len(scheme) + 3:].partition("/")
    if not bucket:
        raise ValueError(f"{uri}: URI has no bucket (expected {scheme}://bucket/key)")
    if object_key and (not key or key.endswith("/")):
        raise ValueError(f"{uri}: URI names no object (expected {scheme}://bucket/key)")
    return scheme, bucket, key


def local_path(uri: str | os.PathLike) -> Path:
    uri = str(uri)
    if _scheme(uri):
        raise ValueError(f"{uri}: a remote URI has no local path (use storage.read_bytes, open_input or local_input)")
    return Path(uri[len("file://"):] if uri.startswith("file://") else uri)


def join(base_uri: str | os.PathLike, *parts: str) -> str:
    """``base/part/...`` for local paths and URIs alike (pathlib would turn ``s3://`` into ``s3:/``).

    Parts are always relative: a leading ``/`` does not restart the path as in ``os.path.join``.
    """
    uri = str(base_uri)
    if _scheme(uri):
        _bucket_key(uri, object_key=False)
    for part in parts:
        if part:
            uri = uri.rstrip("/") + "/" + str(part).lstrip("/")
    return uri


# --- object stores ----------------------------------------------------------------------------


def endpoint_url() -> str | None:
    """The S3 endpoint: ``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``, else ``MLFLOW_S3_ENDPOINT_URL``;
    None means AWS itself."""
    for var in (*AWS_ENDPOINT_VARS, MLFLOW_ENDPOINT_VAR):
        if os.environ.get(var):
            return os.environ[var]
    return None


@functools.lru_cache(maxsize=None)
def _filesystem_for(scheme: str, container: str, endpoint: str | None, pid: int):  # pid: a forked child gets its own
    """``(pyarrow FileSystem, the path of the bucket in it)``: one filesystem serves every bucket of S3
    (at one endpoint) and of GCS; an Azure one is bound to the account that ``container@account`` names."""
    from pyarrow import fs

    if scheme == "s3":
        # An S3-compatible server (MinIO, moto) behind a custom endpoint: Arrow addresses it path-style.
        return fs.S3FileSystem(endpoint_override=endpoint)
    if scheme == "gs":
        return fs.GcsFileSystem()
    return fs.FileSystem.from_uri(f"{scheme}://{container}/")[0]


def _remote(uri: str, *, object_key: bool = True):
    """``(filesystem, path of uri in it, path of its bucket in it)`` for an object-store URI."""
    scheme, bucket, key = _bucket_key(uri, object_key=object_key)
    filesystem = _filesystem_for(
        scheme, bucket if scheme.startswith("abfs") else "", endpoint_url() if scheme == "s3" else None, os.getpid()
    )
    root = bucket.partition("@")[0]  # abfs://container@account.dfs.core.windows.net/key: the container
    return filesystem, f"{root}/{key}".rstrip("/"), root


@contextlib.contextmanager
def _store_errors(uri: str) -> Iterator[None]:
    """Missing buckets and objects become FileNotFoundError naming ``uri``."""
    try:
        yield
    except FileNotFoundError:
        raise FileNotFoundError(f"{uri}: no such object") from None
    except OSError as exc:
        text = str(exc)
        if any(code in text for code in ("NO_SUCH_BUCKET", "NoSuchBucket", "bucket does not exist")):
            raise FileNotFoundError(f"{uri}: bucket does not exist") from None
        raise


def _file_type(filesystem, path: str):
    from pyarrow import fs

    return {fs.FileType.File: "file", fs.FileType.Directory: "directory"}.get(filesystem.get_file_info(path).type)


# --- reading ----------------------------------------------------------------------------------


def exists(uri: str | os.PathLike) -> bool:
    """Whether a local file/directory or a stored object exists (a key prefix does not count)."""
    if not _scheme(uri):
        return local_path(uri).exists()
    filesystem, path, _ = _remote(str(uri))
    return _file_type(filesystem, path) == "file"


def read_bytes(uri: str | os.PathLike) -> bytes:
    if not _scheme(uri):
        try:
            return local_path(uri).read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(f"{uri}: no such file") from None
    filesystem, path, _ = _remote(str(uri))
    with _store_errors(str(uri)), filesystem.open_input_stream(path) as src:
        return src.read()


@contextlib.contextmanager
def open_input(uri: str | os.PathLike) -> Iterator[IO[bytes]]:
    """A seekable binary file to read ``uri`` from (for pyarrow, numpy, torch); a stored object is
    downloaded into an anonymous temporary file first."""
    if not _scheme(uri):
        try:
            fh = open(local_path(uri), "rb")
        except FileNotFoundError:
            raise FileNotFoundError(f"{uri}: no such file") from None
        with fh:
            yield fh
        return
    filesystem, path, _ = _remote(str(uri))
    with tempfile.TemporaryFile() as fh:
        with _store_errors(str(uri)), filesystem.open_input_stream(path) as src:
            shutil.copyfileobj(src, fh, MiB)
        fh.seek(0)
        yield fh


@contextlib.contextmanager
def local_input(uri: str | os.PathLike) -> Iterator[Path]:
    """A local path holding what ``uri`` names, for readers that need a file or a directory (importers).

    A local ``uri`` is its own path. A stored object is downloaded into a temporary directory under its
    own name; a prefix with objects under it is downloaded as a directory tree (the objects' paths
    relative to it kept). A prefix with nothing under it gives a path that does not exist. The copy is
    removed when the block ends.
    """
    if not _scheme(uri):
        yield local_path(uri)
        return
    uri = str(uri)
    key = _bucket_key(uri, object_key=False)[2]
    with tempfile.TemporaryDirectory(prefix="dpsynth-input-") as scratch:
        target = Path(scratch) / (key.rstrip("/").rsplit("/", 1)[-1] or "input")
        if key and not key.endswith("/") and exists(uri):
            copy(uri, target)
        else:
            base = uri.rstrip("/") + "/"
            for member in list_uris(uri):
                copy(member, target / member[len(base):])
        yield target


def sha256(uri: str | os.PathLike) -> str:
    """Hex SHA-256 of the contents of ``uri``."""
    with open_input(uri) as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def list_uris(prefix_uri: str | os.PathLike) -> list[str]:
    """Every file (object) under the directory (key prefix) ``prefix_uri``, recursively, sorted.

    ``prefix_uri`` names a directory: ``s3://b/run1`` lists ``s3://b/run1/...``, not ``s3://b/run10``.
    A prefix with nothing under it gives ``[]``; a bucket that does not exist raises FileNotFoundError.
    """
    prefix_uri = str(prefix_uri)
    if not _scheme(prefix_uri):
        root = local_path(prefix_uri)
        files = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
        return sorted(join(prefix_uri, f) for f in files)
    from pyarrow import fs

    scheme, bucket, _ = _bucket_key(prefix_uri, object_key=False)
    filesystem, path, root = _remote(prefix_uri, object_key=False)
    with _store_errors(prefix_uri):
        if _file_type(filesystem, root) is None:
            raise FileNotFoundError(f"{prefix_uri}: bucket does not exist")
        infos = filesystem.get_file_info(fs.FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(f"{scheme}://{bucket}/{info.path[len(root) + 1:]}" for info in infos if info.type == fs.FileType.File)


# --- writing ----------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_write(uri: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file for ``uri``; when the block succeeds, move it into place (locally:
    fsync, chmod 0644, rename; to an object store: one upload, multipart when large). When the block
    raises, nothing is written and the temporary file is removed."""
    if _scheme(uri):
        filesystem, target, _ = _remote(str(uri))
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
            from pyarrow import fs

            with _store_errors(str(uri)):  # the object appears when the upload completes, whole
                fs.copy_files(tmp, target, source_filesystem=fs.LocalFileSystem(), destination_filesystem=filesystem)
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
    """Copy one file/object, atomically, between any two of local and the object stores (within one
    store server-side, except S3 objects above CopyObject's 5 GiB, which stream through this host)."""
    if _scheme(src_uri) and _scheme(dst_uri):
        (src_fs, src_path, _), (dst_fs, dst_path, _) = _remote(str(src_uri)), _remote(str(dst_uri))
        with _store_errors(str(src_uri)):
            size = src_fs.get_file_info(src_path).size
            if _file_type(src_fs, src_path) != "file":
                raise FileNotFoundError(src_path)
        if src_fs is dst_fs and (_scheme(src_uri) != "s3" or size <= S3_COPY_OBJECT_LIMIT):
            with _store_errors(str(dst_uri)):
                src_fs.copy_file(src_path, dst_path)
            return
    with open_input(src_uri) as src, atomic_write(dst_uri, "wb") as dst:
        shutil.copyfileobj(src, dst, MiB)


def delete(uri: str | os.PathLike) -> None:
    """Remove one file/object; removing one that does not exist is not an error."""
    if not _scheme(uri):
        local_path(uri).unlink(missing_ok=True)
        return
    filesystem, path, _ = _remote(str(uri))
    with contextlib.suppress(FileNotFoundError), _store_errors(str(uri)):
        filesystem.delete_file(path)


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
    """A comparable form of ``uri`` ending in ``/``: remote URIs as they are, local paths absolute."""
    text = str(uri) if _scheme(uri) else os.path.abspath(local_path(uri))
    return text.rstrip("/") + "/"
