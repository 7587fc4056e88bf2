"""How far can the warm-up's released images alone go? (the experiment behind `warmup.styles`; not a test)

Releases the class means (σ₀), then, per round, assigns every training record to the nearest centre of
its class and releases the groups' noisy means (σ of that round; Gaussian, sensitivity C, the stacked
query of dpsynth.warmup.central_images). Centres start from the released class means, deformed at
random (`init random`, k per class) or on a shear × stroke-width grid (`init grid`, the shipped
`warmup.styles`), or are the k-means centres (k per class) of a public set's digits (`init public`:
scikit-learn's 1,797 digits resized as `data.public_source=sklearn:digits` resizes them; `public-sharp`:
the same centres through `warmup.clean`). Scores the released images as `make bench-utility` would score a generator that
reproduced them: a CNN trained on 5,000 random deformations of them, tested on real images [9000:]
never used. ε is the RDP composition of the releases at δ = 1e-5. The noise here comes from torch's
generator: a measurement, not a release.

    benchmarks/run.py warmup-release grid        # the shipped recipe's releases (init grid, sigmas 5,1)
    benchmarks/run.py warmup-release lloyd-k8    # 3 noisy Lloyd rounds (k 8, sigmas 5,2,2,1)
    benchmarks/run.py warmup-release public-k9   # public-set templates (init public, k 9, sigmas 5,0.75)
"""
import json
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from dpsynth.data import read_parquet
from dpsynth.evaluation import classifiers
from dpsynth.warmup import fit as warmup
from dpsynth.privacy import MechanismTrace, full_batch_gaussian
from dpsynth.privacy.registry import get_accountant
def measure(*, k: int = 8, data: str = "outputs/data/mnist.parquet", save: str | None = None, sigmas: str = "5,3,3,1.5",
            clip: float = 10.0, blur: float = 0.0, seed: int = 0, init: str = "deform", grid: str = "shear,thick",
            pool: int = 1) -> dict:
    """The releases (``sigmas``: first the class means', then one per Lloyd round) and the CNN's accuracy on them;
    ``save``: write the released images and classes there (torch.save)."""
    a = SimpleNamespace(k=k, data=data, save=save, sigmas=sigmas, clip=clip, blur=blur, seed=seed, init=init, grid=grid,
                        pool=pool)
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    ds = read_parquet(a.data)
    x, y = ds.to_tensors()
    xtr, ytr, tx, ty = x[:9000], y[:9000], x[9000:], y[9000:]
    C = a.clip; part = C / math.sqrt(2)
    v = ((xtr.double() + 1) / 2).flatten(1)
    v = v * (part / v.norm(dim=1).clamp(min=part)).unsqueeze(1)
    sig = [float(s) for s in a.sigmas.split(",")]
    events = []
    def release(groups, G):  # groups: record -> group id (function of the record + public centres)
        s = torch.zeros(G, v.shape[1] + 1, dtype=torch.float64)
        s.index_add_(0, groups, torch.cat([v, torch.full((len(v), 1), part, dtype=v.dtype)], 1))
        return s
    def means_of(s, sigma):
        s = s + sigma * C * torch.randn(s.shape, dtype=s.dtype)
        events.append(full_batch_gaussian(sigma))
        cnt = (s[:, -1] / part).clamp(min=1.0)
        m = (s[:, :-1] / cnt.unsqueeze(1)).clamp(0, 1)
        return m, cnt
    # round 0: class means
    m0, _ = means_of(release(ytr.long(), 10), sig[0])
    k = a.k
    # init: k deformations of each class mean (public post-processing)
    base = warmup.clean(m0.float().view(10, 1, 28, 28) * 2 - 1)
    g = torch.Generator().manual_seed(a.seed)
    if a.init == "grid":
        import itertools
        lv = {"shear": [0.1, 0.5, 0.9], "thick": [0.15, 0.5, 0.85], "rot": [0.2, 0.5, 0.8], "scale": [0.2, 0.8]}
        axes = a.grid.split(",")
        pts = []
        for combo in itertools.product(*[lv[ax] for ax in axes]):
            u = [0.5] * 6
            for ax, val in zip(axes, combo):
                u[{"rot": 0, "shear": 1, "scale": 2, "thick": 5}[ax]] = val
            pts.append(u)
        U = torch.tensor(pts)
        k = len(pts)
        cent = warmup.deform(base.repeat_interleave(k, 0), U.repeat(10, 1))
    elif a.init in ("public", "public-sharp"):  # k-means centres of a public set's digits, per class
        from sklearn.cluster import KMeans
        from dpsynth.data.public import SKLEARN_DIGITS, load_public_source
        px, py = load_public_source(SKLEARN_DIGITS, shape=(28, 28, 1)).to_tensors()
        cent = torch.cat([torch.from_numpy(KMeans(k, n_init=10, random_state=0).fit(((px[py == c] + 1) / 2).flatten(1).numpy())
                                           .cluster_centers_).float().view(k, 1, 28, 28) * 2 - 1 for c in range(10)])
        cent = warmup.clean(cent) if a.init == "public-sharp" else cent
    else:
        cent = warmup.deform(base.repeat_interleave(k, 0), torch.rand(10 * k, 6, generator=g))  # [-1,1]
    cent = ((cent + 1) / 2).flatten(1).double()
    cy = torch.arange(10).repeat_interleave(k)
    p = a.pool
    def low(t):  # N x 784 in [0,1] -> N x (784/p^2)
        return F.avg_pool2d(t.float().view(-1, 1, 28, 28), p).flatten(1).double() if p > 1 else t
    vl = low(v)  # norm <= |v|/p <= part/p
    cent_l = low(cent)
    rounds = sig[1:]
    for r, s_r in enumerate(rounds):
        final = r == len(rounds) - 1
        d = torch.cdist(vl, cent_l)
        d[cy.unsqueeze(0) != ytr.long().unsqueeze(1)] = float("inf")
        grp = d.argmin(1)
        if final:
            m, cnt = means_of(release(grp, 10 * k), s_r)
            keep = cnt < 20
            m[keep] = cent[keep] if cent.shape[1] == m.shape[1] else m[keep]
            cent = m
        else:
            s = torch.zeros(10 * k, vl.shape[1] + 1, dtype=torch.float64)
            pl = part / p
            s.index_add_(0, grp, torch.cat([vl, torch.full((len(vl), 1), pl, dtype=vl.dtype)], 1))
            s = s + s_r * (C / p) * torch.randn(s.shape, dtype=s.dtype)
            events.append(full_batch_gaussian(s_r))
            cnt = (s[:, -1] / pl).clamp(min=1.0)
            ml = (s[:, :-1] / cnt.unsqueeze(1)).clamp(0, 1)
            keep = cnt < 20
            ml[keep] = cent_l[keep]
            cent_l = ml
        print(f"round {r+1} σ={s_r} counts min {cnt.min():.0f} median {cnt.median():.0f}", flush=True)
    acc = get_accountant("rdp")
    trace = MechanismTrace(events)
    eps = acc.epsilon(trace, delta=1e-5)
    img = cent.float().view(-1, 1, 28, 28)
    if a.blur > 0:
        r = 2; t = torch.arange(-r, r + 1).float(); w = torch.exp(-t**2 / (2 * a.blur**2)); w = w / w.sum()
        img = F.conv2d(F.pad(img, (r, r, r, r), mode="replicate"), (w.view(-1, 1) * w.view(1, -1)).view(1, 1, 5, 5))
    img = warmup.clean(img * 2 - 1)
    def evaluate(cent, cy, n=5000, seed=0):
        g = torch.Generator().manual_seed(seed)
        labels = torch.arange(n) % 10
        out = torch.empty(n, 1, 28, 28)
        for c in range(10):
            idx = (labels == c).nonzero().view(-1); pool = (cy == c).nonzero().view(-1)
            pick = pool[torch.randint(len(pool), (len(idx),), generator=g)]
            out[idx] = warmup.deform(cent[pick], torch.rand(len(idx), 6, generator=g))
        mdl = classifiers.CNN(channels=1, image_size=28, num_classes=10)
        classifiers.fit(mdl, out, labels, epochs=5, seed=seed)
        return classifiers.accuracy(mdl, tx, ty)
    result = {"k": k, "sigmas": sig, "blur": a.blur, "eps": eps, "acc": round(evaluate(img, cy), 4)}
    print(json.dumps(result), flush=True)
    if a.save:
        torch.save({"images": img, "labels": cy}, a.save)
    return result
