"""The lifetime privacy-budget ledger: every attempt at a private stage is charged to its population.

:mod:`store` keeps the ledger (SQLite or PostgreSQL), :mod:`attempt` opens and settles one attempt around a private
stage, :mod:`charging` finds a run's ledger and population, :mod:`cli` is ``dpsynth ledger``.
"""
