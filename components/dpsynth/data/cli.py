"""``dpsynth data import`` and ``dpsynth data info``."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the dataset modules import NumPy and pyarrow: only when a command runs
    from dpsynth.data.dataset import ImageDataset


def register(subparsers) -> None:
    data = subparsers.add_parser(
        "data",
        help="import datasets into the canonical Parquet format and inspect them",
        description="Import a labelled image dataset into dpsynth's canonical Parquet format, or describe one.",
    )
    actions = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")

    imp = actions.add_parser(
        "import",
        help="convert SRC into canonical Parquet at DST",
        description=(
            "Convert SRC into canonical Parquet at DST, validating it on the way; DST is written "
            "atomically, so a failure leaves nothing there. SRC is one of: a directory of IDX pairs "
            "(STEM-images-idx3-ubyte[.gz] + STEM-labels-idx1-ubyte[.gz], e.g. MNIST; several pairs "
            "are imported together with splits train/test), an .npz file (keys x|images, y|labels, "
            "optional ids|record_ids), a directory of class subfolders of PNG/JPEG images, or a "
            "canonical .parquet file."
        ),
    )
    imp.add_argument("src", metavar="SRC", help="IDX directory, .npz file, image folder or .parquet file")
    imp.add_argument("dst", metavar="DST", help="where to write the Parquet dataset (local path)")
    imp.add_argument(
        "--num-classes", type=_positive_int, metavar="K",
        help="number of classes; every label must be in [0, K-1] (default: max label + 1)",
    )
    imp.add_argument(
        "--split", metavar="NAME",
        help="set every record's split (e.g. train, test, public), replacing any the source implies",
    )
    imp.add_argument("--json", action="store_true", help="print the summary as JSON")
    view = imp.add_mutually_exclusive_group()
    view.add_argument(
        "--outside", action="store_true",
        help="print only what may leave the sensitive zone (destination, image shape, the keyed version): no "
        "content sha256, no counts; the default, named by the orchestrators whose logs others read (a raw digest of "
        "the records is a membership test for anyone who knows the other records)",
    )
    view.add_argument(
        "--inside", action="store_true",
        help="the data owner's view: also the rows, the classes and the content sha256 (for your own terminal, "
        "never a log others read; dpsynth/egress.py INSIDE)",
    )
    imp.add_argument(
        "--versioned", action="store_true",
        help="also keep this version, immutable, at DST-without-.parquet/VERSION.parquet (VERSION: a keyed id of the "
        "records' content, never their raw hash) and print it with \"changed\" (false when VERSION is the newest "
        "import to DST already: nothing is written); records arriving for the first time form the next privacy block "
        "(DST-without-.parquet/blocks.json; docs/privacy.md, \"Privacy blocks\")",
    )
    imp.set_defaults(func=run_import)

    info = actions.add_parser(
        "info",
        help="describe a canonical Parquet dataset",
        description="Read and validate a canonical Parquet dataset, then print its rows, classes, "
        "image shape, per-class counts, splits and content sha256.",
    )
    info.add_argument("uri", metavar="URI", help="the Parquet dataset to describe")
    info.add_argument("--json", action="store_true", help="print as JSON")
    info.set_defaults(func=run_info)


def run_import(args: argparse.Namespace) -> int:
    from dpsynth.data.dataset import write_parquet
    from dpsynth.data.importers import import_source

    ds = import_source(args.src, num_classes=args.num_classes, split=args.split)
    version = _import_version(ds, args.dst) if args.versioned else {}
    if version.get("changed", True):
        write_parquet(ds, args.dst)
        if version:
            from dpsynth.data import versions

            versions.record(args.dst, version["version"])
    if version:  # records arriving for the first time form the next privacy block (#54)
        from dpsynth.data import blocks

        blocks.record_import(args.dst, version["version"], ds.record_ids)
    summary = {**_basics(ds), "uri": str(args.dst), **version}
    if not args.inside:  # what the import DAG keeps (XCom, the asset event), and any log: through the egress gate
        from dpsynth import egress

        summary = egress.let_out({"uri": str(args.dst), "shape": summary["shape"], **version}, "import")
        done = "wrote" if version.get("changed", True) else "unchanged (the newest version already):"
        print(json.dumps(summary) if args.json else f"{done} a dataset of shape {_shape_text(ds)} to {args.dst}"
              + (f", version {version['version']}" if version else ""))
        return 0
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"wrote {summary['rows']} rows, {summary['num_classes']} classes, "
            f"shape {_shape_text(ds)}, sha256 {summary['sha256']} to {args.dst}"
        )
    return 0


def _import_version(ds: ImageDataset, dst: str) -> dict:
    """``{"version", "versioned_uri", "changed"}`` of an import of ``ds`` to ``dst`` (:mod:`dpsynth.data.versions`);
    writes the versioned copy when it is new."""
    from dpsynth import storage
    from dpsynth.data import versions
    from dpsynth.data.dataset import write_parquet

    vid = versions.version_id(dst, ds.content_sha256())
    at = versions.uri(dst, vid)
    changed = versions.latest(dst) != vid
    if changed and not storage.exists(at):
        write_parquet(ds, at)
    return {"version": vid, "versioned_uri": at, "changed": changed}


def run_info(args: argparse.Namespace) -> int:
    import numpy as np

    from dpsynth.data.dataset import read_parquet

    ds = read_parquet(args.uri)
    class_counts = np.bincount(ds.labels, minlength=ds.num_classes).tolist()
    split_names = ds.splits or [None] * len(ds)
    named = sorted({s for s in split_names if s is not None})
    splits = [{"split": s, "rows": split_names.count(s)} for s in ([None] if None in split_names else []) + named]
    report = {**_basics(ds), "uri": str(args.uri), "class_counts": class_counts, "splits": splits, "source": ds.source}
    if args.json:
        print(json.dumps(report))
        return 0
    rows = [
        ("uri", report["uri"]),
        ("rows", report["rows"]),
        ("classes", report["num_classes"]),
        ("shape", f"{_shape_text(ds)} (H×W×C)"),
        ("per class", " ".join(f"{k}:{c}" for k, c in enumerate(class_counts))),
        ("splits", " ".join(f"{s['split'] or '(none)'}:{s['rows']}" for s in splits)),
        ("sha256", report["sha256"]),
        ("source", report["source"]),
    ]
    for key, value in rows:
        print(f"{key:<10} {value}")
    return 0


def _basics(ds: ImageDataset) -> dict:
    return {"rows": len(ds), "num_classes": ds.num_classes, "shape": list(ds.shape), "sha256": ds.content_sha256()}


def _shape_text(ds: ImageDataset) -> str:
    return "x".join(str(d) for d in ds.shape)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
