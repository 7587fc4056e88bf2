"""What post-processing of an already released generator does to its utility (CPU, one thread).

For one finished run directory (``utility.py --out``: a passed audit, ``release/sample/generator.pt``), draws
synthetic sets from the released generator under variants and scores each as the evaluate stage does: the
CNN trained on the synthetic records (epoch chosen on synthetic validation data), tested on the held-out
half of the partition's hold-out that the evaluate stage tests on; fid_classifier and IS in the reference
classifier's features. No training record is read, and nothing private is spent: every variant is
post-processing of the audited generator. Variants, as ``key=value`` lists:

    contrast=S      the generator's fixed contrast layer (``train.g_contrast``) set to S (0: none)
    n=N             synthetic records (default 10000), classes balanced, as ``dpsynth sample`` draws them
    epochs=E        CNN epochs (default: the run's ``evaluate.epochs``)
    seed=K          the sample seed (default 0)
    recolour=1      each RGB sample's luminance redrawn between two colours drawn uniformly per image (a
                    data-independent colour family: does a grey generator serve colour data better recoloured?)
    sharp=S         each sample's luminance made nearly two-tone around its own mean: sigmoid(S·(l − mean) / std),
                    on every channel (before recolour=1: a figure in one colour on a ground in another)
    grey=1          a diagnostic, not a release: the synthetic records *and the real test records* reduced to their
                    luminance (on every channel) before the CNN trains and tests: does an RGB release fail to
                    transfer because of its colours? (fid_classifier and IS stay in the colour reference's features)

    .venv/stage/bin/python benchmarks/run.py posthoc-release   # the suite in benchmarks/suites.toml; arguments: measure()

Results (2026-11-25) are in ``benchmarks/README.md`` (the contrast layer).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from dpsynth.config import load_config
from dpsynth.data.dataset import read_parquet
from dpsynth.evaluation import accuracy, fid
from dpsynth.evaluation.classifiers import ReferenceClassifier
from dpsynth.training.artifacts import load_generator
from dpsynth.stages.evaluate import _split, quality
from dpsynth.stages.sample import synthesize


KEYS = ("contrast", "n", "epochs", "seed", "recolour", "grey", "sharp")


def parse(spec: str) -> dict:
    """``contrast=4,n=20000`` → {"contrast": 4.0, "n": 20000}."""
    out = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if key not in KEYS:
            raise SystemExit(f"variant {spec!r}: unknown key {key!r} ({', '.join(KEYS)})")
        out[key] = float(value) if key in ("contrast", "sharp") else int(value)
    return out


def luminance(images):
    """uint8 N×H×W×C images' channel mean, N×H×W×1 float64 on [0, 255]."""
    import numpy as np

    return images.astype(np.float64).mean(-1, keepdims=True)


def recolour(images, seed: int):
    """uint8 N×H×W×C images, each one's luminance (channel mean, on [0, 1]) redrawn as c0 + l·(c1 − c0), its two
    colours c0, c1 drawn uniformly on [0, 1]^C per image (numpy PCG64 from ``seed``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lum = luminance(images) / 255
    c0, c1 = (rng.random((len(images), 1, 1, images.shape[-1])) for _ in range(2))
    return np.round((c0 + lum * (c1 - c0)) * 255).clip(0, 255).astype(np.uint8)


def sharpen(images, s: float):
    """uint8 N×H×W×C images, each one's luminance l (channel mean, on [0, 1]) mapped to sigmoid(s·(l − mean) / std)
    over that image's own pixels, repeated on every channel."""
    import numpy as np

    lum = luminance(images) / 255
    z = (lum - lum.mean((1, 2, 3), keepdims=True)) / lum.std((1, 2, 3), keepdims=True).clip(min=1e-6)
    m = np.round(255 / (1 + np.exp(-s * z))).astype(np.uint8)
    return np.repeat(m, images.shape[-1], axis=-1)


def grey(images):
    """uint8 N×H×W×C images reduced to their luminance (the channel mean), repeated on every channel."""
    import numpy as np

    lum = np.round(luminance(images)).astype(np.uint8)
    return np.repeat(lum, images.shape[-1], axis=-1)


def tones(images) -> dict:
    """Fractions of pixels that are ink (≥ 224 of 255) and grey (32–223): real digits are nearly two-tone."""
    return {"ink": float((images >= 224).mean()), "grey": float(((images >= 32) & (images < 224)).mean())}


def measure(*, run_dir: str, variants: list[str]) -> list[dict]:
    """Each of ``variants`` (``key=value,…`` of KEYS) applied to the generator a utility run released in
    ``run_dir`` (…/dpgan-mnist-cpu-eps10), scored as the evaluate stage scores it."""
    a = SimpleNamespace(run_dir=Path(run_dir), variants=list(variants))
    rows = []
    torch.set_num_threads(1)
    run = a.run_dir
    cfg = load_config(run / "sensitive/train/config.yaml")
    generator, _ = load_generator(str(run / "release/sample/generator.pt"))
    trained_contrast = getattr(generator, "contrast", None)
    if trained_contrast is None and any("contrast" in parse(v) for v in a.variants):
        raise SystemExit(f"{run}: its generator ({type(generator).__name__}) has no contrast layer (the DCGAN one has)")
    reference = read_parquet(run / "sensitive/partition/heldout.parquet")
    fit_idx, test_idx = _split(len(reference), fraction=0.5, seed=cfg.evaluate.seed)  # the evaluate stage's split
    fit_real, test_real = reference.subset(fit_idx), reference.subset(test_idx)
    classifier = ReferenceClassifier(fit_real, steps=cfg.evaluate.feature_steps, seed=cfg.evaluate.seed)
    space = fid.feature_space(None, classifier)
    print(json.dumps({"run_dir": str(run), "reference_test_tones": tones(test_real.images)}), flush=True)
    for spec in a.variants:
        v = parse(spec)
        start = time.process_time()
        if trained_contrast is not None:
            generator.contrast = v.get("contrast", trained_contrast)
        synthetic = synthesize(generator, num_samples=v.get("n", 10000), seed=v.get("seed", 0))
        if v.get("sharp"):
            synthetic = dataclasses.replace(synthetic, images=sharpen(synthetic.images, v["sharp"]))
        if v.get("recolour"):
            synthetic = dataclasses.replace(synthetic, images=recolour(synthetic.images, v.get("seed", 0)))
        e = dataclasses.replace(cfg.evaluate, epochs=v.get("epochs", cfg.evaluate.epochs), max_train_records=None)
        c = dataclasses.replace(cfg, evaluate=e)
        val_idx, train_idx = _split(len(synthetic), fraction=e.validation_fraction, seed=e.seed)
        seen = (lambda d: dataclasses.replace(d, images=grey(d.images))) if v.get("grey") else (lambda d: d)
        cnn = accuracy.evaluate("cnn", c, synthetic=seen(synthetic.subset(train_idx)),
                                validation=seen(synthetic.subset(val_idx)), fit_real=seen(fit_real),
                                test_real=seen(test_real))
        q = quality(c, synthetic=synthetic, fit_real=fit_real, test_real=test_real, classifier=classifier, space=space)
        row = {"run_dir": str(run), "variant": spec, "trained_contrast": trained_contrast,
               "cnn_gen2real": cnn["gen2real"], "synthetic_validation": cnn["model_selection"].get("validation_accuracy"),
               "fid_classifier": q["frechet"]["value"], "fid_real_vs_real": q["frechet"]["real_vs_real"],
               "inception_score": q["inception_score"]["mean"], "tones": tones(synthetic.images),
               "cpu_s": round(time.process_time() - start, 1)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows
