"""Train the public segmenter (:mod:`dpsynth.prior.segmenter`) on the prior's own paintings, from public seeds only.

Every training example is drawn here: a figure of the prior (:func:`dpsynth.prior.figures.random_figures`), its
mask (:func:`~dpsynth.prior.figures.masks`, the target) and its painting (:func:`dpsynth.prior.paint.paint`,
graphic or photographic as the prior paints, a quarter of them grey), each from ``numpy.random.default_rng`` of
a public seed. No record, no image file and no dataset is read: :func:`paintings` takes only seeds and counts. The
validation paintings come from another seed. The weights are written as a ``.npz`` of the network's state dict.

    OMP_NUM_THREADS=2 nice .venv/stage/bin/python scripts/train_segmenter.py   # the committed weights

(the defaults are the committed weights' settings; docs/prior.md gives its time and losses).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpsynth.prior import segmenter
from dpsynth.prior.figures import masks, random_figures
from dpsynth.prior.paint import paint

SIZE = 32
GREY_SHARE = 0.25


def paintings(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` prior paintings and their masks from the public ``seed``: (float32 N × 4 × SIZE × SIZE inputs of the
    network, float32 N × SIZE × SIZE masks). A random share :data:`GREY_SHARE` is painted grey, and every colour
    painting has its channels permuted and, with probability ½, inverted (the prior paints any colour)."""
    rng = np.random.default_rng(seed)
    m = masks(random_figures(rng, n), SIZE)
    grey = rng.random(n) < GREY_SHARE
    x = np.empty((n, 4, SIZE, SIZE), np.float32)
    if grey.any():
        x[grey] = segmenter.inputs(paint(m[grey], rng, channels=1))
    colour = paint(m[~grey], rng, channels=3)
    for i in range(len(colour)):
        colour[i] = colour[i][..., rng.permutation(3)]
        if rng.random() < 0.5:
            colour[i] = 255 - colour[i]
    x[~grey] = segmenter.inputs(colour)
    return x, m


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=int, default=16000, help="training paintings (seed --seed)")
    ap.add_argument("--val", type=int, default=1000, help="validation paintings (seed --seed + 1)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(segmenter.WEIGHTS))
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0, cpu0 = time.monotonic(), time.process_time()
    xt, mt = paintings(args.seed, args.train)
    xv, mv = paintings(args.seed + 1, args.val)
    print(f"paintings: {len(xt)} train, {len(xv)} val, {time.process_time() - cpu0:.0f} CPU-s", flush=True)
    xt, mt, xv, mv = map(torch.from_numpy, (xt, mt, xv, mv))
    net = segmenter.network()
    print(f"parameters: {sum(p.numel() for p in net.parameters())}", flush=True)
    steps = args.epochs * (len(xt) // args.batch)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps)
    gen = torch.Generator().manual_seed(args.seed)

    def evaluate():
        net.eval()
        with torch.no_grad():
            logits = torch.cat([net(xv[i:i + 500]) for i in range(0, len(xv), 500)])[:, 0]
        net.train()
        p = torch.sigmoid(logits)
        inter = ((p > 0.5) & (mv > 0.5)).sum((1, 2)).float()
        union = ((p > 0.5) | (mv > 0.5)).sum((1, 2)).float().clamp(min=1)
        return F.binary_cross_entropy_with_logits(logits, mv).item(), (inter / union).mean().item()

    for epoch in range(args.epochs):
        order, total = torch.randperm(len(xt), generator=gen), 0.0
        for b in range(len(xt) // args.batch):
            idx = order[b * args.batch:(b + 1) * args.batch]
            loss = F.binary_cross_entropy_with_logits(net(xt[idx])[:, 0], mt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item()
        val, iou = evaluate()
        print(f"epoch {epoch + 1}: train BCE {total / (len(xt) // args.batch):.4f}, val BCE {val:.4f}, "
              f"val IoU {iou:.3f} ({time.process_time() - cpu0:.0f} CPU-s, {time.monotonic() - t0:.0f} s)",
              flush=True)
    net.eval()
    np.savez(args.out, **{k: v.detach().cpu().numpy() for k, v in net.state_dict().items()})
    print(f"weights: {args.out}", flush=True)


if __name__ == "__main__":
    main()
