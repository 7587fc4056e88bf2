"""``dpsynth release verify | keygen``: check a release directory from its files alone; make a signing key."""

from __future__ import annotations

import json


def register(subparsers) -> None:
    release = subparsers.add_parser("release", help="verify a release directory (its card, sha256s, ε, signature)",
                                    description="The auditor's commands for a release (RUN_DIR/release).")
    actions = release.add_subparsers(dest="release_command", required=True, metavar="ACTION")
    verify = actions.add_parser(
        "verify", help="check every released file's sha256, recompute ε from the released trace, check the signature",
        description="Check RELEASE_DIR (RUN_DIR/release) from its files alone: every file card/card.json lists has "
        "its sha256 and nothing unlisted was released; card/trace.json is the audited trace and the one the "
        "generator is bound to; ε recomputed from it (RDP and PRV, or WOR) equals the card's and the audit "
        "report's, the largest of them equals the card's headline ε, and it is within the target; the ε the card "
        "says the run charged each privacy block it read is recomputed from the trace and the attempts it lists; "
        "with --public-key, card/card.json.sig verifies. Exit 2 unless all pass.")
    verify.add_argument("release_dir", metavar="RELEASE_DIR")
    verify.add_argument("--public-key", metavar="PEM", help="the ed25519 public key the card must be signed with")
    verify.add_argument("--json", action="store_true", help="print the checks as JSON")
    verify.set_defaults(func=verify_command)
    keygen = actions.add_parser("keygen", help="make an ed25519 key to sign release cards ($DPSYNTH_SIGNING_KEY)",
                                description="Write a new ed25519 private key (PEM, mode 0600) to --out and print "
                                "its public key; point $DPSYNTH_SIGNING_KEY at the private key.")
    keygen.add_argument("--out", required=True, metavar="PATH", help="where to write the private key (must not exist)")
    keygen.set_defaults(func=keygen_command)


def verify_command(args) -> int:
    from dpsynth.errors import AuditFailed
    from dpsynth.release.card import verify

    checks = verify(args.release_dir, public_key=args.public_key)
    if args.json:
        print(json.dumps(checks, indent=2))
    else:
        for c in checks:
            print(f"{'ok  ' if c['passed'] else 'FAIL'} {c['name']}: {c['detail']}")
        if not args.public_key:
            print("note: signature not checked (give --public-key)")
    failed = [c["name"] for c in checks if not c["passed"]]
    if failed:
        raise AuditFailed(f"release verification failed: {', '.join(failed)}")
    return 0


def keygen_command(args) -> int:
    from dpsynth.release.card import keygen

    print(keygen(args.out).decode(), end="")
    return 0
