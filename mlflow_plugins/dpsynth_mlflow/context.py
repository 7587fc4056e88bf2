"""The run-context provider: lineage tags on every MLflow run a dpsynth stage starts.

MLflow asks each registered provider, at ``mlflow.start_run``, whether it is "in context" and
for its tags; tags passed to ``start_run`` explicitly override these.
"""

from __future__ import annotations

import os

from mlflow.tracking.context.abstract_context import RunContextProvider

from dpsynth import tracking


class LineageContextProvider(RunContextProvider):
    """In context while any of ``tracking.ENV_CONTEXT``'s variables is set (a stage is running)."""

    def in_context(self) -> bool:
        return any(os.environ.get(name) for name in tracking.ENV_CONTEXT.values())

    def tags(self) -> dict[str, str]:
        tags = {tag: os.environ[name] for tag, name in tracking.ENV_CONTEXT.items() if os.environ.get(name)}
        tags.update(tracking.lineage_tags())  # the code version, its commit and image
        return tracking.run_tags(tags)  # through the egress gate (dpsynth.egress.TAGS)
