"""The ledger page outside the sensitive zone (#52 finding 7): on the cluster MLflow's object-store key reads only
MLflow's bucket, so reading the sensitive zone's version key raises there (AccessDenied)."""

from dpsynth import storage
from dpsynth.stages.protocol import VERSION_KEY
from dpsynth_mlflow import ledger_view


def test_sensitive_files_are_named_unavailable_when_the_page_cannot_read_the_sensitive_zone(tmp_path, monkeypatch):
    (tmp_path / "sensitive").mkdir()
    (tmp_path / "sensitive" / VERSION_KEY).write_bytes(b"k" * 32)
    assert ledger_view._outside(str(tmp_path))("ab" * 32) != "unavailable"  # the positive control: a readable key

    def denied(uri):
        raise PermissionError(f"AccessDenied: {uri}")

    monkeypatch.setattr(storage, "read_bytes", denied)
    assert ledger_view._outside(str(tmp_path))("ab" * 32) == "unavailable"
