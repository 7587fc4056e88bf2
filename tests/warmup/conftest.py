"""Fixtures of the warm-up tests: the trainer tests' ``shards`` (tests/methods/conftest.py)."""

from tests.methods.conftest import shards  # noqa: F401
