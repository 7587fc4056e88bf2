"""Privacy accounting: mechanism traces, accountants (RDP, PRV, without-replacement), noise calibration, budget guard.

The flow: training records one :class:`MechanismEvent` per step into a
:class:`MechanismTrace`, asks a :class:`BudgetGuard` before every step, and stores the
trace; the audit recomputes ε from the stored trace with :func:`epsilon`.
"""

from dpsynth.privacy.accountants import (
    ACCOUNTANTS,
    Accountant,
    PRVAccountant,
    RDPAccountant,
    epsilon,
    get_accountant,
    register_accountant,
)
from dpsynth.privacy.budget import BudgetGuard, check_delta
from dpsynth.privacy.calibration import calibrate_noise, max_additional_steps, max_steps
from dpsynth.privacy.events import TRACE_FORMAT, MechanismEvent, MechanismTrace, fold_releases
from dpsynth.privacy.wor import WORAccountant, as_published_epsilon, gswgan_event  # registers "wor"

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
    "get_accountant",
    "gswgan_event",
    "max_additional_steps",
    "max_steps",
    "register_accountant",
]
