"""One ``quietly`` (#35): a tracking store or a ledger that cannot be read gives None, any other failure raises."""

import pytest
from sqlalchemy.exc import OperationalError

from dpsynth.errors import ConfigError
from dpsynth.ledger import charging


def fail(exc):
    raise exc


def test_quietly_swallows_only_user_facing_and_database_errors():
    assert charging.quietly(lambda x: x + 1, 1) == 2
    assert charging.quietly(fail, ConfigError("tracking.uri: unreadable")) is None
    assert charging.quietly(fail, OperationalError("select", {}, Exception("locked"))) is None
    with pytest.raises(ZeroDivisionError):
        charging.quietly(lambda: 1 / 0)
