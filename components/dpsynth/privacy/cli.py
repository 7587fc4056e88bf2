"""``dpsynth privacy epsilon`` and ``dpsynth privacy noise``: the accountants from a shell."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the accountants import Opacus and torch: only when a command runs
    from dpsynth.privacy.events import MechanismEvent

_MECHANISM = (
    "The mechanism is T steps of the subsampled Gaussian: per-record contributions are clipped to "
    "norm C, summed, and N(0, (S*C)^2) noise is added. With --sampling poisson (default) each record "
    "joins a step's batch with probability Q (add/remove adjacency; accountants rdp, prv); with "
    "--sampling without_replacement a step uses a fixed-size batch or one of 1/Q shards (replace-one "
    "adjacency, sensitivity 2C; accountant wor). The reported epsilon is an upper bound."
)

# Each sampling scheme with its adjacency and default accountant (see dpsynth.privacy.events).
_SAMPLING = {"poisson": ("add_remove", "rdp"), "without_replacement": ("replace_one", "wor")}


def register(subparsers) -> None:
    privacy = subparsers.add_parser(
        "privacy",
        help="compute epsilon for a DP-SGD schedule, or the noise a target epsilon needs",
        description="Privacy accounting for the subsampled Gaussian mechanism (DP-SGD, GS-WGAN).",
    )
    actions = privacy.add_subparsers(dest="privacy_command", required=True, metavar="ACTION")

    eps = actions.add_parser(
        "epsilon",
        help="epsilon spent by T steps at noise multiplier S and sample rate Q",
        description="Print an upper bound on epsilon at DELTA. " + _MECHANISM,
    )
    eps.add_argument("--noise-multiplier", type=float, required=True, metavar="S",
                     help="noise standard deviation divided by the clipping norm C")
    _common(eps)
    eps.set_defaults(func=run_epsilon)

    noise = actions.add_parser(
        "noise",
        help="the smallest noise multiplier (within 1%%) that keeps T steps within epsilon E",
        description="Calibrate the noise multiplier S so that T steps spend at most E; the answer "
        "never exceeds E and is within 1% of the smallest S that does. " + _MECHANISM,
    )
    noise.add_argument("--epsilon", type=float, required=True, metavar="E", help="target epsilon, > 0")
    _common(noise)
    noise.set_defaults(func=run_noise)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sample-rate", type=float, required=True, metavar="Q",
                        help="sampling rate, in (0, 1]: (expected) batch size / dataset size, "
                        "or 1/K for one of K shards")
    parser.add_argument("--sampling", choices=sorted(_SAMPLING), default="poisson",
                        help="poisson (add/remove adjacency) or without_replacement (fixed-size batches or shards, "
                        "replace-one adjacency); default poisson")
    parser.add_argument("--steps", type=int, required=True, metavar="T", help="number of steps (noise calibration needs >= 1)")
    parser.add_argument("--delta", type=float, required=True, metavar="D",
                        help="target delta, in (0, 1); use less than 1/(dataset size)")
    parser.add_argument("--accountant", type=_accountant, default=None, metavar="NAME",
                        help="rdp (Renyi DP, Opacus) or prv (PRV accountant, tighter, slower) for poisson "
                        "sampling; wor (Wang-Balle-Kasiviswanathan RDP bound) for without_replacement; "
                        "default rdp, or wor with --sampling without_replacement")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _accountant(name: str) -> str:
    """An accountant's name, checked against the registry (imported only when the option is given)."""
    from dpsynth.privacy.registry import ACCOUNTANTS

    if name not in ACCOUNTANTS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(sorted(ACCOUNTANTS))}, got {name!r}")
    return name


def _resolve(args: argparse.Namespace) -> str:
    """The sensitivity model of ``args.sampling``; fills in the default accountant for it."""
    sensitivity, default_accountant = _SAMPLING[args.sampling]
    if args.accountant is None:
        args.accountant = default_accountant
    return sensitivity


def _event(args: argparse.Namespace, noise_multiplier: float) -> MechanismEvent:
    from dpsynth.privacy.events import MechanismEvent
    from dpsynth.privacy.checks import as_count

    return MechanismEvent(
        sampling=args.sampling, sample_rate=args.sample_rate, noise_multiplier=noise_multiplier,
        sensitivity=_resolve(args), count=as_count(args.steps, "steps"),
    )


def _report(args: argparse.Namespace, result: dict, line: str) -> int:
    print(json.dumps(result) if args.json else line)
    return 0


def run_epsilon(args: argparse.Namespace) -> int:
    from dpsynth.privacy.registry import epsilon

    event = _event(args, args.noise_multiplier)
    eps = epsilon([event], delta=args.delta, accountant=args.accountant)
    result = {
        "epsilon": eps, "delta": args.delta, "accountant": args.accountant,
        "noise_multiplier": event.noise_multiplier, "sample_rate": event.sample_rate, "steps": event.count,
        "sampling": event.sampling, "sensitivity": event.sensitivity,
    }
    line = (f"epsilon <= {eps:.4f} at delta = {args.delta:g} ({args.accountant}; noise multiplier "
            f"{event.noise_multiplier:g}, sample rate {event.sample_rate:.6g}, {event.count} steps)")
    return _report(args, result, line)


def run_noise(args: argparse.Namespace) -> int:
    from dpsynth.privacy.registry import epsilon
    from dpsynth.privacy.calibration import calibrate_noise

    sensitivity = _resolve(args)
    sigma = calibrate_noise(
        target_epsilon=args.epsilon, delta=args.delta, sample_rate=args.sample_rate,
        steps=args.steps, accountant=args.accountant, sampling=args.sampling, sensitivity=sensitivity,
    )
    event = _event(args, sigma)
    eps = epsilon([event], delta=args.delta, accountant=args.accountant)
    result = {
        "noise_multiplier": sigma, "epsilon": eps, "target_epsilon": args.epsilon, "delta": args.delta,
        "accountant": args.accountant, "sample_rate": event.sample_rate, "steps": event.count,
        "sampling": event.sampling, "sensitivity": event.sensitivity, "rel_tol": 0.01,
    }
    line = (f"noise multiplier {sigma:.4f} spends epsilon <= {eps:.4f} (target {args.epsilon:g}) at "
            f"delta = {args.delta:g} ({args.accountant}; sample rate {event.sample_rate:.6g}, {event.count} steps)")
    return _report(args, result, line)
