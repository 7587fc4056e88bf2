"""The warm-up's releases with and without the variation release (`warmup.variations`), as DPGANTrainer
runs them (the library's functions), and what the fitted generator keeps of them (CPU; not a test).

Per config and seed: releases (`warmup.release`, as every trainer's warm-up does) the class means (σ `sm`,
default 5), the `st` × `st` style groups (σ_s `ss`, default 3 × 3 at 1; st=0: none) and, with r > 0, each
class's r variation directions (σ_v `sv`, clip C_v `cv`), and prints the releases' ε at δ = 1e-5; then either scores the release itself
(`s=0`: a CNN trained on 5,000 samples of the fit's own targets, deformed and varied as G would learn them)
or fits G (`s` steps, width `w`, lr) and scores 5,000 of G's samples. The CNN is tested on real images
[9000:], never used for anything else. The noise comes from a seeded MechanismRandomness: a measurement,
not a release. Seeds pair the releases and the CNNs across configs.

    benchmarks/run.py warmup-variations                      # seeds "0,1,2", configs "r=0:s=0;r=5:sv=1:s=0;r=5:sv=2:s=0"
    benchmarks/run.py warmup-variations --arg 'configs="r=0:warp=1;r=5:sv=1:warp=1"'   # train.g_warp
"""
import json
import math
import time
from types import SimpleNamespace

import torch
from dpsynth.data import read_parquet
from dpsynth.evaluation import classifiers
from dpsynth.warmup import fit as warmup
from dpsynth.warmup import releases as warmup_releases
from dpsynth.models.dcgan import Generator
from dpsynth.config import load_config
from dpsynth.privacy import MechanismTrace, get_accountant
from dpsynth.mechanisms.randomness import MechanismRandomness
def measure(*, seeds: str = "0,1", configs: str = "r=5:sv=2", n: int = 5000,
            data: str = "outputs/data/mnist.parquet") -> list[dict]:
    """Each of ``configs`` (``;``-separated, see above) at each of ``seeds``: the releases' ε and the CNN's accuracy."""
    a = SimpleNamespace(seeds=seeds, configs=configs, n=n, data=data)
    rows = []
    torch.set_num_threads(1)
    x, y = read_parquet(a.data).to_tensors()
    xtr, ytr, tx, ty = x[:9000], y[:9000], x[9000:], y[9000:]
    def run(conf, seed):
        kw = dict(p.split("=") for p in conf.split(":"))
        r = int(kw.get("r", 0)); steps = int(kw.get("s", 4000))
        width = int(kw.get("w", 32)); lr = float(kw.get("lr", 1e-3)); levels = int(kw.get("st", 3))
        # sm, ss, sv: σ of the means, styles and variations releases; st: style levels (0: none); cv: C_v
        cfg = load_config(overrides=[
            "warmup.central_images=true", f"warmup.noise_multiplier={kw.get('sm', 5)}", f"warmup.styles={levels}",
            f"warmup.styles_noise_multiplier={kw.get('ss', 1.0)}", f"warmup.variations={r}",
            f"warmup.variations_noise_multiplier={kw.get('sv', 2)}", f"warmup.variations_clip={kw.get('cv', 5)}",
            "train.latent_dim=100"])
        eps = get_accountant("rdp").epsilon(MechanismTrace(warmup_releases.events(cfg)), delta=1e-5)
        mech = MechanismRandomness(seed=seed)
        images, dirs, _ = warmup.release(cfg, xtr, ytr, num_classes=10, randomness=mech, trace=None)
        k = warmup.style_slots(cfg)
        if steps == 0:  # the release's ceiling: the fit's targets themselves
            g = torch.Generator().manual_seed(2000 + seed)
            labels = torch.arange(a.n) % 10
            z = torch.randn(a.n, 100, generator=g)
            pick = labels * k + (0.5 * (1 + torch.erf(z[:, 6] / math.sqrt(2))) * k).long().clamp(max=k - 1)
            xs = warmup.deform(warmup.vary(images[pick], labels, z, dirs), 0.5 * (1 + torch.erf(z[:, :6] / math.sqrt(2))))
            m = classifiers.CNN(channels=1, image_size=28, num_classes=10)
            classifiers.fit(m, xs, labels, epochs=5, seed=100 + seed)
            return classifiers.accuracy(m, tx, ty), 0, eps
        torch.manual_seed(seed)
        G = Generator(num_classes=10, width=width, styles=k, warp=bool(int(kw.get("warp", 0))))
        t0 = time.process_time()
        warmup.fit_generator(G, images, steps=steps, batch_size=128, lr=lr, generator=torch.Generator().manual_seed(seed), directions=dirs)
        fit = time.process_time() - t0
        labels = torch.arange(a.n) % 10
        with torch.no_grad():
            xs, ys = G.sample(a.n, labels=labels, generator=torch.Generator().manual_seed(2000 + seed))
        m = classifiers.CNN(channels=1, image_size=28, num_classes=10)
        classifiers.fit(m, xs, ys, epochs=5, seed=100 + seed)
        return classifiers.accuracy(m, tx, ty), fit, eps
    for conf in a.configs.split(";"):
        res = [run(conf, s) for s in map(int, a.seeds.split(","))]
        accs = [r[0] for r in res]
        rows.append({"conf": conf, "eps_releases": round(res[0][2], 3), "accs": [round(v, 3) for v in accs], "mean": round(sum(accs) / len(accs), 4),
                     "fit_cpu_s": round(sum(r[1] for r in res) / len(res))})
        print(json.dumps(rows[-1]), flush=True)
    return rows
