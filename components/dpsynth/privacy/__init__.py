"""Privacy accounting: mechanism traces, accountants (RDP, PRV, without-replacement), noise calibration, budget guard.

The flow: training records one :class:`MechanismEvent` per step into a
:class:`MechanismTrace`, asks a :class:`BudgetGuard` before every step, and stores the
trace; the audit recomputes ε from the stored trace with :func:`epsilon`.
"""

from dpsynth.lazy import attributes

# Imported on first use (PEP 562), so the CLI can register `dpsynth privacy` and `dpsynth ledger`
# without loading Opacus and torch.
_WHERE = {
    **dict.fromkeys(["Accountant", "PRVAccountant", "RDPAccountant"], "accountants"),
    **dict.fromkeys(["ACCOUNTANTS", "epsilon", "get_accountant", "register_accountant"], "registry"),
    **dict.fromkeys(["BudgetGuard", "check_delta"], "budget"),
    **dict.fromkeys(["calibrate_noise", "max_additional_steps", "max_steps"], "calibration"),
    **dict.fromkeys(["TRACE_FORMAT", "MechanismEvent", "MechanismTrace", "fold_releases", "full_batch_gaussian"], "events"),
    **dict.fromkeys(["WORAccountant", "as_published_epsilon", "gswgan_event"], "without_replacement"),
}


__getattr__ = attributes(__name__, _WHERE)


__all__ = [
    "ACCOUNTANTS",
    "Accountant",
    "BudgetGuard",
    "MechanismEvent",
    "MechanismTrace",
    "PRVAccountant",
    "RDPAccountant",
    "TRACE_FORMAT",
    "WORAccountant",
    "as_published_epsilon",
    "calibrate_noise",
    "check_delta",
    "epsilon",
    "fold_releases",
    "full_batch_gaussian",
    "get_accountant",
    "gswgan_event",
    "max_additional_steps",
    "max_steps",
    "register_accountant",
]
