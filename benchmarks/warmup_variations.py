"""The warm-up's releases with and without the variation release (`warmup.variations`), as DPGANTrainer
runs them (the library's functions), and what the fitted generator keeps of them (CPU; not a test).

Per config and seed: releases the class means (σ = 5), the 3 × 3 style groups (σ_s, default 1) and, with
r > 0, each class's r variation directions (σ_v, clip C_v); then either scores the release itself
(`s=0`: a CNN trained on 5,000 samples of the fit's own targets, deformed and varied as G would learn them)
or fits G (`s` steps, width `w`, lr) and scores 5,000 of G's samples. The CNN is tested on real images
[9000:], never used for anything else. The noise comes from a seeded MechanismRandomness: a measurement,
not a release. Seeds pair the releases and the CNNs across configs.

    python benchmarks/warmup_variations.py --seeds 0,1,2 --configs "r=0:s=0;r=5:sv=1:s=0;r=5:sv=2:s=0"
    python benchmarks/warmup_variations.py --seeds 0,1 --configs "r=0;r=5:sv=1;r=5:sv=1:w=48"
    python benchmarks/warmup_variations.py --seeds 0,1 --configs "r=0:warp=1;r=5:sv=1:warp=1"   # train.g_warp
"""
import sys, math, time, json, argparse, torch
from dpsynth.data import read_parquet
from dpsynth.evaluation import classifiers
from dpsynth.methods import warmup
from dpsynth.models.dcgan import Generator
from dpsynth.privacy import central_images as ci
from dpsynth.privacy.randomness import MechanismRandomness
ap = argparse.ArgumentParser()
ap.add_argument("--seeds", default="0,1")
ap.add_argument("--configs", default="r=5:sv=2")
ap.add_argument("--n", type=int, default=5000)
ap.add_argument("--data", default="outputs/data/mnist.parquet")
a = ap.parse_args()
torch.set_num_threads(1)
x, y = read_parquet(a.data).to_tensors()
xtr, ytr, tx, ty = x[:9000], y[:9000], x[9000:], y[9000:]
def run(conf, seed):
    kw = dict(p.split("=") for p in conf.split(":"))
    r = int(kw.get("r", 0)); sv = float(kw.get("sv", 2)); cv = float(kw.get("cv", 5)); steps = int(kw.get("s", 4000))
    width = int(kw.get("w", 32)); lr = float(kw.get("lr", 1e-3))
    mech = MechanismRandomness(seed=seed)
    means, cc = ci.central_images(xtr, ytr, num_classes=10, clip=10.0, noise_multiplier=5.0, randomness=mech, with_counts=True)
    means = warmup.clean(means)
    tpl, tcls = warmup.style_templates(means, 3)
    st, cnt = ci.style_images(xtr, ytr, tpl, tcls, clip=10.0, noise_multiplier=float(kw.get("ss", 1.0)), randomness=mech)
    images = warmup.fill_styles(warmup.clean(st), cnt, means)
    dirs = ci.variation_directions(xtr, ytr, images, tcls, cc, rank=r, clip=cv, noise_multiplier=sv, randomness=mech) if r else None
    if steps == 0:  # the release's ceiling: the fit's targets themselves
        g = torch.Generator().manual_seed(2000 + seed)
        labels = torch.arange(a.n) % 10
        z = torch.randn(a.n, 100, generator=g)
        pick = labels * 9 + (0.5 * (1 + torch.erf(z[:, 6] / math.sqrt(2))) * 9).long().clamp(max=8)
        xs = warmup.deform(warmup.vary(images[pick], labels, z, dirs), 0.5 * (1 + torch.erf(z[:, :6] / math.sqrt(2))))
        m = classifiers.CNN(channels=1, image_size=28, num_classes=10)
        classifiers.fit(m, xs, labels, epochs=5, seed=100 + seed)
        return classifiers.accuracy(m, tx, ty), 0
    torch.manual_seed(seed)
    G = Generator(num_classes=10, width=width, styles=9, warp=bool(int(kw.get("warp", 0))))
    t0 = time.process_time()
    warmup.fit_generator(G, images, steps=steps, batch_size=128, lr=lr, generator=torch.Generator().manual_seed(seed), directions=dirs)
    fit = time.process_time() - t0
    labels = torch.arange(a.n) % 10
    with torch.no_grad():
        xs, ys = G.sample(a.n, labels=labels, generator=torch.Generator().manual_seed(2000 + seed))
    m = classifiers.CNN(channels=1, image_size=28, num_classes=10)
    classifiers.fit(m, xs, ys, epochs=5, seed=100 + seed)
    return classifiers.accuracy(m, tx, ty), fit
for conf in a.configs.split(";"):
    res = [run(conf, s) for s in map(int, a.seeds.split(","))]
    accs = [r[0] for r in res]
    print(json.dumps({"conf": conf, "accs": [round(v, 3) for v in accs], "mean": round(sum(accs) / len(accs), 4),
                      "fit_cpu_s": round(sum(r[1] for r in res) / len(res))}), flush=True)
