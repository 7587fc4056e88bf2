"""The accountants by name: what ``privacy.accountant`` and the audit may name (after Opacus' accountant registry).

One table, filled here from the accountant classes, so no accountant module imports another to be found.
"""

from __future__ import annotations

from typing import Iterable

from dpsynth.errors import PrivacyError
from dpsynth.privacy.accountants import Accountant, PRVAccountant, RDPAccountant
from dpsynth.privacy.events import MechanismEvent, MechanismTrace
from dpsynth.privacy.without_replacement import WORAccountant

ACCOUNTANTS: dict[str, type[Accountant]] = {cls.name: cls for cls in (RDPAccountant, PRVAccountant, WORAccountant)}


def register_accountant(cls: type[Accountant]) -> type[Accountant]:
    """Class decorator: make ``cls`` available as ``get_accountant(cls.name)``."""
    ACCOUNTANTS[cls.name] = cls
    return cls


def get_accountant(name: str | Accountant, **options) -> Accountant:
    """The accountant called ``name`` (an Accountant instance is returned as is)."""
    if isinstance(name, Accountant):
        if options:
            raise PrivacyError("accountant: options given together with an accountant instance")
        return name
    try:
        cls = ACCOUNTANTS[name]
    except (KeyError, TypeError):
        raise PrivacyError(f"accountant: must be one of {', '.join(sorted(ACCOUNTANTS))}; got {name!r}") from None
    return cls(**options)


def epsilon(
    trace: MechanismTrace | Iterable[MechanismEvent], *, delta: float, accountant: str | Accountant = "rdp"
) -> float:
    """Upper bound on ε of ``trace`` at ``delta`` by the named accountant."""
    return get_accountant(accountant).epsilon(trace, delta=delta)
