"""storage: local paths and s3:// (gs://, abfs://) URIs through one interface, against a real moto_server over loopback."""

import hashlib
import os
import stat
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dpsynth import storage


@pytest.fixture(params=["local", "s3"])
def base(request, tmp_path) -> str:
    """A base URI to write under: a local directory or a prefix in a fresh bucket."""
    if request.param == "local":
        return str(tmp_path / "store")
    return f"s3://{request.getfixturevalue('s3_bucket')}/store"


@pytest.fixture
def both(tmp_path, s3_bucket) -> dict[str, str]:
    return {"local": str(tmp_path / "store"), "s3": f"s3://{s3_bucket}/store"}


def test_round_trip_bytes_and_text(base):
    uri = storage.join(base, "a", "b.bin")
    assert not storage.exists(uri)
    storage.write_bytes(uri, b"\x00\x01payload")
    assert storage.exists(uri)
    assert storage.read_bytes(uri) == b"\x00\x01payload"
    storage.write_text(uri, "überschrieben\n")  # overwrite; text is UTF-8
    assert storage.read_bytes(uri) == "überschrieben\n".encode()
    with storage.open_input(uri) as fh:
        assert fh.read() == "überschrieben\n".encode()


def test_atomic_write_leaves_nothing_when_the_block_raises(base, tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"  # where S3 writes buffer
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    uri = storage.join(base, "out.bin")
    with pytest.raises(RuntimeError, match="boom"):
        with storage.atomic_write(uri) as fh:
            fh.write(b"half")
            raise RuntimeError("boom")
    assert not storage.exists(uri)
    assert storage.list_uris(base) == []
    if not storage.is_remote(base):
        assert os.listdir(base) == []  # no temp file left beside it

    storage.write_bytes(uri, b"old")
    with pytest.raises(RuntimeError):
        with storage.atomic_write(uri) as fh:
            fh.write(b"new")
            raise RuntimeError("boom")
    assert storage.read_bytes(uri) == b"old"
    assert storage.list_uris(base) == [uri]
    assert os.listdir(scratch) == []


def test_local_write_is_0644_and_file_uris_work(tmp_path):
    storage.write_bytes(f"file://{tmp_path}/x.bin", b"x")
    assert stat.S_IMODE(os.stat(tmp_path / "x.bin").st_mode) == 0o644
    assert storage.read_bytes(tmp_path / "x.bin") == b"x"
    assert storage.list_uris(f"file://{tmp_path}") == [f"file://{tmp_path}/x.bin"]


def test_list_uris_and_delete(base):
    for name in ("b.txt", "a.txt", "sub/c.txt"):
        storage.write_text(storage.join(base, name), name)
    storage.write_text(base + "-sibling/x.txt", "not under base")
    expected = [storage.join(base, n) for n in ("a.txt", "b.txt", "sub/c.txt")]
    assert storage.list_uris(base) == expected
    assert storage.list_uris(base + "/") == expected
    assert storage.list_uris(storage.join(base, "sub")) == [storage.join(base, "sub/c.txt")]
    assert storage.list_uris(storage.join(base, "nothing-here")) == []

    storage.delete(expected[0])
    storage.delete(expected[0])  # deleting what is gone is fine
    assert not storage.exists(expected[0])
    assert storage.list_uris(base) == expected[1:]


@pytest.mark.parametrize("src_kind", ["local", "s3"])
@pytest.mark.parametrize("dst_kind", ["local", "s3"])
def test_copy_across_schemes_and_sha256(both, src_kind, dst_kind):
    data = os.urandom(100_000)
    src = storage.join(both[src_kind], "src.bin")
    dst = storage.join(both[dst_kind], "copied", "dst.bin")
    storage.write_bytes(src, data)
    storage.copy(src, dst)
    assert storage.read_bytes(dst) == data
    assert storage.sha256(src) == storage.sha256(dst) == hashlib.sha256(data).hexdigest()


def test_missing_objects_raise_file_not_found_naming_the_uri(base, s3_env):
    missing = storage.join(base, "missing.bin")
    for call in (storage.read_bytes, storage.sha256, lambda u: storage.copy(u, u + ".copy")):
        with pytest.raises(FileNotFoundError, match=missing):
            call(missing)
    with pytest.raises(FileNotFoundError, match=missing):
        with storage.open_input(missing):
            pass
    no_bucket = "s3://no-such-bucket-here/x.bin"
    assert not storage.exists(no_bucket)
    for call in (storage.read_bytes, lambda u: storage.write_bytes(u, b"x"), storage.list_uris):
        with pytest.raises(FileNotFoundError, match=no_bucket):
            call(no_bucket)


@pytest.mark.parametrize(
    "bad", ["s3://", "s3:///key", "s3://bucket", "s3://bucket/", "s3:/bucket/key", "gs:/b/k", "http://b/k", "gs://b"]
)
def test_bad_uris_raise_value_error_naming_them(bad):
    with pytest.raises(ValueError) as info:
        storage.read_bytes(bad)
    assert bad in str(info.value)


def test_bad_uris_in_other_calls():
    with pytest.raises(ValueError, match="s3://"):
        storage.join("s3://", "x")
    with pytest.raises(ValueError, match="no bucket"):
        storage.list_uris("s3://")
    with pytest.raises(ValueError, match="no local path"):
        storage.local_path("s3://bucket/key")


def test_join():
    assert storage.join("s3://b", "x", "y.bin") == "s3://b/x/y.bin"
    assert storage.join("s3://b/run/", "/x") == "s3://b/run/x"
    assert storage.join("/tmp/out", "a/b", "") == "/tmp/out/a/b"


def test_parquet_written_to_s3_reads_back_with_pyarrow(both):
    table = pa.table({"record_id": ["a", "b"], "label": pa.array([1, 2], pa.int64())})
    for base in both.values():
        uri = storage.join(base, "data.parquet")
        with storage.atomic_write(uri, "wb") as fh:
            pq.write_table(table, fh)
        assert pq.read_table(pa.BufferReader(storage.read_bytes(uri))).equals(table)
        with storage.open_input(uri) as fh:
            assert pq.read_table(fh).equals(table)


def test_endpoint_precedence(monkeypatch):
    """AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (the AWS SDKs' own settings), else MLflow's, else AWS."""
    for var in (*storage.AWS_ENDPOINT_VARS, storage.MLFLOW_ENDPOINT_VAR):
        monkeypatch.delenv(var, raising=False)
    assert storage.endpoint_url() is None
    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", "http://mlflow")
    assert storage.endpoint_url() == "http://mlflow"
    for var, url in (("AWS_ENDPOINT_URL", "http://aws"), ("AWS_ENDPOINT_URL_S3", "http://aws-s3")):
        monkeypatch.setenv(var, url)
        assert storage.endpoint_url() == url  # the S3-specific one wins


def test_gcs_and_azure_uris_go_through_the_same_calls():
    """gs:// and abfs:// resolve to Arrow's GCS and Azure filesystems (no network: nothing is read)."""
    from pyarrow import fs

    filesystem, path, root = storage._remote("gs://bucket/run/data.parquet")
    assert isinstance(filesystem, fs.GcsFileSystem) and (path, root) == ("bucket/run/data.parquet", "bucket")
    filesystem, path, root = storage._remote("abfs://data@account.dfs.core.windows.net/run/x.pt")
    assert isinstance(filesystem, fs.AzureFileSystem) and (path, root) == ("data/run/x.pt", "data")
    assert storage.join("gs://bucket", "a", "b") == "gs://bucket/a/b"
    z = storage.Zones.from_root("gs://bucket/p")
    assert z.zone_of("gs://bucket/p/release/x") == "release"


def test_mlflow_endpoint_alone_reaches_the_server(s3_bucket, moto_endpoint, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", moto_endpoint)
    storage.write_bytes(f"s3://{s3_bucket}/m.bin", b"m")
    assert storage.read_bytes(f"s3://{s3_bucket}/m.bin") == b"m"


def test_large_objects_go_up_in_parts_and_round_trip(s3_env, s3_bucket, tmp_path):
    """A large upload goes up in parts (Arrow's 10 MiB): the ETag of a multipart object is
    "<md5 of the part md5s>-<number of parts>"."""
    data = os.urandom(11 * storage.MiB)  # 2 parts: 10 + 1 MiB
    uri, copied = f"s3://{s3_bucket}/big/model.pt", f"s3://{s3_bucket}/big/copy.pt"
    with storage.atomic_write(uri) as fh:
        fh.write(data)
    assert s3_env.head_object(Bucket=s3_bucket, Key="big/model.pt")["ETag"].strip('"').endswith("-2")
    storage.copy(uri, copied)  # S3 to S3, server-side
    for u in (uri, copied):
        assert storage.sha256(u) == hashlib.sha256(data).hexdigest()
    storage.copy(uri, tmp_path / "local.pt")
    assert (tmp_path / "local.pt").read_bytes() == data


def test_local_input_downloads_an_object_or_a_prefix(s3_bucket, tmp_path):
    for name in ("d/a.bin", "d/sub/b.bin", "d2/c.bin"):
        storage.write_bytes(f"s3://{s3_bucket}/{name}", name.encode())
    with storage.local_input(f"s3://{s3_bucket}/d/a.bin") as path:
        assert path.name == "a.bin" and path.read_bytes() == b"d/a.bin"
    with storage.local_input(f"s3://{s3_bucket}/d") as path:
        assert sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()) == ["a.bin", "sub/b.bin"]
    assert not path.exists()  # removed after the block
    with storage.local_input(f"s3://{s3_bucket}/nothing") as path:
        assert not path.exists()
    with storage.local_input(tmp_path) as path:
        assert path == tmp_path


def test_zones(tmp_path):
    z = storage.Zones.from_root("s3://bucket/pipeline")
    assert z == storage.Zones("s3://bucket/pipeline/sensitive", "s3://bucket/pipeline/release")
    assert z.zone_of("s3://bucket/pipeline/sensitive/shards/0.parquet") == "sensitive"
    assert z.zone_of("s3://bucket/pipeline/release/generator.pt") == "release"
    assert z.zone_of("s3://bucket/pipeline/release-notes.txt") is None
    assert z.zone_of(tmp_path / "release" / "x") is None

    separate = storage.Zones(sensitive="s3://raw-data", release="s3://published/dpsynth")
    assert separate.zone_of("s3://raw-data/x") == "sensitive"
    assert separate.zone_of("s3://published/dpsynth/y") == "release"

    local = storage.Zones.from_root(tmp_path)
    assert local.zone_of(f"file://{tmp_path}/release/a") == "release"
    assert local.zone_of(tmp_path / "sensitive" / ".." / "sensitive" / "b") == "sensitive"

    with pytest.raises(ValueError, match="overlap"):
        storage.Zones(sensitive="s3://b/data", release="s3://b/data/release")
