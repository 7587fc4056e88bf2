"""The HTML report: every section present, values escaped, internal metrics labelled, images inline."""

import base64
import io

from PIL import Image

from dpsynth.evaluation import report


def example() -> dict:
    row = {"classifier": "logreg", "gen2real": 0.81, "real": 0.9, "calibrated": 0.9, "real2gen": 0.7}
    return {
        "privacy": {"epsilon": 9.87, "delta": 1e-5, "target_epsilon": 10, "epsilons": {"rdp": 9.87, "prv": {"upper": 9.2}},
                    "accountant": "rdp+prv", "audit": "passed"},
        "reference": {"uri": "s3://b/<heldout>.parquet", "kind": "heldout", "records": 1000, "status": "releasable",
                      "split": {"fit": 500, "test": 500}, "note": "held out"},
        "utility": {"classifiers": [row, {"classifier": "xgboost", "skipped": "xgboost not installed"}],
                    "average": {k: row[k] for k in ("gen2real", "real", "calibrated", "real2gen")},
                    "records": {"synthetic_train": 9000, "synthetic_validation": 1000, "real_train": 500, "real_test": 500}},
        "quality": {"frechet": {"name": "fid_classifier", "value": 12.5, "real_vs_real": 0.4, "features": "CNN"},
                    "inception_score": {"mean": 8.1, "std": 0.2, "classifier": "CNN"}, "js_score": {"js_score": 0.12}},
        "membership_inference": {"auc": 0.51, "tpr_at_1pct_fpr": 0.01, "attack": "GAN-Leaks",
                                 "records": {"held_in": 500, "held_out": 500, "generated": 5000}, "note": "reads training records"},
        "labels": {"utility": "releasable", "quality": "releasable", "membership_inference": "internal"},
    }


def test_sections_values_and_escaping():
    grid = Image.new("L", (4, 3), 128)
    page = report.html(example(), grids={"by class": grid})
    for text in ("<h2>Privacy</h2>", "Reference data", "Utility", "Quality", "Membership inference", "Samples",
                 "9.87", "0.810 (90%)", "skipped: xgboost not installed", "fid_classifier", "0.5100",
                 "class=\"tag internal\"", "class=\"tag releasable\""):
        assert text in page, text
    assert "s3://b/&lt;heldout&gt;.parquet" in page and "<heldout>" not in page
    assert ">FID<" not in page
    encoded = page.split("data:image/png;base64,")[1].split('"')[0]
    assert Image.open(io.BytesIO(base64.b64decode(encoded))).size == (4, 3)


def test_skipped_membership_inference():
    r = example()
    r["membership_inference"] = {"skipped": "evaluate.mia is false"}
    assert "skipped: evaluate.mia is false" in report.html(r, grids={})
