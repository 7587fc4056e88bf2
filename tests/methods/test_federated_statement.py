"""The federated GS-WGAN's statement says what its guarantee against the server rests on: the server's process
could read the clients' files (their secret noise coins among them), and is assumed not to (issue #33 item 7)."""

from dpsynth.mechanisms.generator_gradient import FEDERATED
from tests.methods.gswgan_helpers import tiny


def test_the_statement_names_the_same_host_assumption_against_the_server(tmp_path):
    cfg = tiny(tmp_path, "privacy.noise_multiplier=8.0", method="gswgan_federated")
    st = FEDERATED.statement(cfg, FEDERATED.plan(cfg, 600), n=600)
    (server,) = [a for a in st["assumptions"] if a.startswith("Against the server")]
    assert "secret noise coins" in server and "could read" in server and "not covered" in server
    assert any("server" in a["against"] for a in st["accounts"])
