"""The errors dpsynth raises for bad input. The CLI turns each into a message and exit code 2."""


class DpsynthError(Exception):
    """Base class: a user-facing problem with input, configuration or budget."""


class ConfigError(DpsynthError):
    """A configuration value is missing, of the wrong type or out of range; the message names the field."""


class DatasetError(DpsynthError):
    """A dataset cannot be read or fails validation; the message names the problem and the field."""


class PrivacyError(DpsynthError):
    """An impossible privacy request (bad epsilon/delta, budget that cannot be met, unsupported mechanism)."""


class StageError(DpsynthError):
    """A pipeline stage cannot run: an upstream stage has not succeeded, or its outputs do not match its manifest."""


class AuditFailed(StageError):
    """The audit recomputed the privacy guarantee and it does not meet the target; nothing may be released."""
