"""Ablation of DPGAN's private discriminator step: which part of the DP path stops a GAN learning?

Arms (same models, optimizer, seed, steps; n_D = 1):
  plain     uniform batches of B, mean loss, no clipping, no noise
  poisson   + Poisson batches, loss summed over real and fake and divided by 2B
  clip-ew   + per-example clipping at C (Opacus expanded weights), no noise
  clip-hooks  the same with Opacus hooks
  noise-ew  + Gaussian noise σ (calibrated for epsilon at steps)
  trainer   dpsynth's DPGANTrainer itself (n_D = 1, σ as noise-ew)

Each arm reports D's accuracy on fakes along the way and a quick gen2real accuracy (CNN trained on
5,000 generated images, tested on held-out real images never trained on). Not a test.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
import time

from statistics import mean

import torch
import torch.nn.functional as F
from opacus.grad_sample.utils import prepare_module

from dpsynth.data.importers import import_source
from dpsynth.evaluation import classifiers
from dpsynth.models.dcgan import Discriminator, Generator
from dpsynth.privacy import calibrate_noise
from dpsynth.mechanisms.dpsgd import GradientSanitizer


def gen2real(G, test_x, test_y, *, n=5000, epochs=5, seed=0):
    with torch.no_grad():
        labels = torch.arange(n) % 10
        x, y = G.sample(n, labels=labels, generator=torch.Generator().manual_seed(seed))
    model = classifiers.CNN(channels=1, image_size=28, num_classes=10)
    classifiers.fit(model, x, y, epochs=epochs, seed=seed)
    return classifiers.accuracy(model, test_x, test_y)


def run_arm(arm, x, y, test_x, test_y, *, steps, B, width, C, sigma, seed, log_every, warm=None, n_d=1,
            lr_d=2e-4, lr_g=2e-4, d_opt="adam", return_generator=False):
    torch.manual_seed(seed)
    n = len(x)
    G = Generator(num_classes=10, width=width)
    if warm:
        G.load_state_dict(torch.load(warm)["G"])
        print(f"  warm G: gen2real {gen2real(G, test_x, test_y):.3f}", flush=True)
    D = Discriminator(num_classes=10, width=width)
    opt_d = (torch.optim.Adam(D.parameters(), lr=lr_d, betas=(0.5, 0.999)) if d_opt == "adam"
             else torch.optim.SGD(D.parameters(), lr=lr_d, momentum=0.9))
    opt_g = torch.optim.Adam(G.parameters(), lr=lr_g, betas=(0.5, 0.999))
    rng = torch.Generator().manual_seed(seed)
    private = arm.startswith(("clip", "noise"))
    mode = "hooks" if arm.endswith("hooks") else "ew"
    Dp = prepare_module(D, mode, loss_reduction="sum") if private else D
    san = GradientSanitizer(list(D.parameters()), max_grad_norm=C, noise_multiplier=sigma if arm.startswith("noise") else 0.0,
                            expected_batch_size=2 * B, generator=rng) if private else None
    accs, accs_real = [], []
    k = max(1, log_every // n_d)  # generator steps per log line
    t0 = time.process_time()
    for step in range(1, steps + 1):
        if arm == "plain":
            idx = torch.randperm(n, generator=rng)[:B]
        else:
            idx = (torch.rand(n, generator=rng) < B / n).nonzero().view(-1)
        rx, ry = x[idx], y[idx]
        with torch.no_grad():
            fx, fy = G.sample(B, generator=rng)
        if arm == "plain":
            loss = F.softplus(-D(rx, ry)).mean() + F.softplus(D(fx, fy)).mean()
            opt_d.zero_grad()
            loss.backward()
        else:
            xs, ys = torch.cat([rx, fx]), torch.cat([ry, fy])
            real = torch.cat([torch.ones(len(rx)), torch.zeros(B)]).bool()
            logits = Dp(xs, ys)
            loss = F.softplus(torch.where(real, -logits, logits)).sum()
            opt_d.zero_grad()
            loss.backward()
            if private:
                san.accumulate()
                san.finalize()
            else:
                for p in D.parameters():
                    p.grad = p.grad / (2 * B)
        opt_d.step()
        if step % n_d:
            continue
        # generator step every n_D discriminator steps
        if private and mode == "hooks":
            Dp.disable_hooks()
        D.requires_grad_(False)
        with torch.no_grad():
            fx, fy = G.sample(B, generator=rng)
            acc = (D(fx, fy) < 0).float().mean().item()
            accs_real.append((D(rx, ry) > 0).float().mean().item())
        fx, fy = G.sample(B, generator=rng)
        g_loss = F.softplus(-D(fx, fy)).mean()
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
        D.requires_grad_(True)
        if private and mode == "hooks":
            Dp.enable_hooks()
        accs.append(acc)
        if step % log_every == 0:
            print(f"  {arm:10s} step {step:5d}  D fake acc (mean of last {log_every}) "
                  f"{mean(accs[-k:]):.2f}  real acc {mean(accs_real[-k:]):.2f}  cpu {time.process_time() - t0:.0f} s", flush=True)
        if step % 500 == 0 and step < steps and not return_generator:
            print(f"  {arm:10s} step {step:5d}  gen2real {gen2real(G, test_x, test_y):.3f}", flush=True)
    cpu = time.process_time() - t0
    if return_generator:
        return G
    return {"arm": arm, "gen2real_cnn": gen2real(G, test_x, test_y), "cpu_s": cpu,
            "d_fake_acc_last": mean(accs[-k:])}


def measure(*, data: str = "data/mnist", steps: int = 1000, batch_size: int = 128, width: int = 32, clip: float = 1.0,
            epsilon: float = 10.0, arms: str = "plain,poisson,clip-ew,noise-ew", log_every: int = 100,
            sigma: float | None = None, warm: str | None = None, n_d: int = 1, lr_d: float = 2e-4, lr_g: float = 2e-4,
            d_opt: str = "adam", threads: int = 1) -> list[dict]:
    """Each of ``arms`` trained ``steps`` steps; ``sigma``: the noise arms' noise multiplier (default: calibrated to
    ``epsilon``); ``warm``: start G from this checkpoint ({'G': state_dict})."""
    a = SimpleNamespace(data=data, steps=steps, batch_size=batch_size, width=width, clip=clip, epsilon=epsilon,
                        arms=arms, log_every=log_every, sigma=sigma, warm=warm, n_d=n_d, lr_d=lr_d, lr_g=lr_g,
                        d_opt=d_opt, threads=threads)
    torch.set_num_threads(a.threads)
    ds = import_source(a.data)
    xall, yall = ds.to_tensors()
    x, y, test_x, test_y = xall[:9000], yall[:9000], xall[9000:], yall[9000:]
    sigma = calibrate_noise(target_epsilon=a.epsilon, delta=1e-5, sample_rate=a.batch_size / len(x), steps=a.steps,
                            accountant="rdp") if a.sigma is None else a.sigma
    print(f"sigma for eps={a.epsilon} at {a.steps} steps: {sigma:.4f}")
    results = []
    for arm in a.arms.split(","):
        r = run_arm(arm, x, y, test_x, test_y, steps=a.steps, B=a.batch_size, width=a.width, C=a.clip,
                    sigma=sigma, seed=0, log_every=a.log_every, warm=a.warm, n_d=a.n_d, lr_d=a.lr_d, lr_g=a.lr_g,
                    d_opt=a.d_opt)
        r["sigma"] = sigma if arm.startswith("noise") else 0.0
        print(json.dumps(r), flush=True)
        results.append(r)
    return results
