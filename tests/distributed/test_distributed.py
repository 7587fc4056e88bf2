"""DPGAN and dp-GAN (Zhang) data-parallel on torch.distributed (gloo, CPU): a W-rank job is the one-process mechanism.

(a) with the noise off, a 2-rank step equals a 1-process step on the same logical batch (the union of the
ranks' Poisson masks; for dp-GAN also the union of the units' latents and interpolation weights, with its clip
groups chosen from public data); (b) the noise of a logical step is added once, N(0, (σC)²) — per clip group
N(0, (σc_j)²) — from rank 0's stream; (c) only rank 0 writes (trace, checkpoints, grids, MLflow), one event per
logical step; (d) a checkpoint written by 2 ranks resumes on 1 and vice versa with the same trace and ε; and
`dpsynth train` on 2 ranks is one ledger attempt, and such a job killed mid-run resumes in one process. The ranks
are in tests/methods/distributed_workers.py, forked from one warm interpreter (a fresh one imports torch, Opacus and
dpsynth: seconds of CPU per rank); a real torchrun job of `dpsynth train`: tests/distributed/test_train_torchrun.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from opacus.accountants import RDPAccountant

from dpsynth.errors import ConfigError
from dpsynth.methods import dpgan
from dpsynth.methods.dpgan import DPGANTrainer
from dpsynth.methods.zhang import ZhangTrainer
from dpsynth.distributed import ranks as distributed
from dpsynth.mechanisms.randomness import MechanismRandomness
from tests.methods import distributed_workers as workers
from tests.torch_threads import one_torch_thread  # noqa: F401 (autouse: the in-process reference runs as a rank does)


def rdp_epsilon(sigma: float, q: float, steps: int, delta: float = 1e-4) -> float:
    """An independent account of the trace (Opacus' RDP accountant)."""
    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    return acc.get_epsilon(delta)


def assert_same_models(a: dict, b: dict, **tol) -> None:
    for key in ("D", "G"):
        for name in a[key]:
            torch.testing.assert_close(a[key][name], b[key][name], **tol, msg=lambda m: f"{key}.{name}: {m}")


# --- the ranks' shares, without a process group -------------------------------------------------------
# The 2-rank jobs of (a)–(c) below, on the same two ranks, one after the other. Each job writes under a folder of
# its own; the tests only read them.
DPGAN_STEPS = 3
NOISE = dict(sigma=2.0, bound=0.5, draws=60, seed=123)
ZHANG_STEPS = 4  # n_critic = 2: two generator steps between them
ZHANG_NOISE = dict(draws=12, seed=321)
GSWGAN_STEPS = 6


@pytest.fixture(scope="module")
def ranks_ran(tmp_path_factory) -> dict[str, Path]:
    home = tmp_path_factory.mktemp("ranks")
    jobs = {
        "dpgan": (workers.steps_without_noise, DPGAN_STEPS),
        "noise": (workers.noise_draws, *NOISE.values()),
        "zhang-ghost": (workers.zhang_steps_without_noise, ZHANG_STEPS, "ghost"),
        "zhang-ew": (workers.zhang_steps_without_noise, ZHANG_STEPS, "ew"),
        "zhang-noise": (workers.zhang_noise, *ZHANG_NOISE.values()),
        "gswgan": (workers.gswgan_steps, "gswgan", GSWGAN_STEPS),
        "dpac": (workers.gswgan_steps, "dpac", GSWGAN_STEPS),
        "own-dirs": (workers.train_in_own_dirs,),  # last: a whole run, with MLflow
    }
    dirs = {name: home / name for name in jobs}
    for d in dirs.values():
        d.mkdir()
    workers.run_ranks_many(2, home, [(fn, str(dirs[name]), *args) for name, (fn, *args) in jobs.items()])
    return dirs


def test_parts_partition_the_index_space_and_one_process_is_unchanged():
    for n, world in [(600, 2), (601, 3), (5, 4), (0, 2)]:
        parts = [distributed.Ranks(rank=r, world_size=world).part(n) for r in range(world)]
        assert [i for lo, hi in parts for i in range(lo, hi)] == list(range(n))
        assert max(hi - lo for lo, hi in parts) - min(hi - lo for lo, hi in parts) <= 1
    a, b = MechanismRandomness(seed=5), MechanismRandomness(seed=5)
    assert torch.equal(distributed.SINGLE.poisson_take(a, 100, 0.3), b.poisson_mask(100, 0.3))
    x = torch.arange(10)
    assert distributed.SINGLE.share(x)[0] is x
    assert torch.equal(distributed.Ranks(rank=1, world_size=2).share(x)[0], torch.arange(5, 10))


def test_the_owner_of_an_index_is_the_rank_whose_part_holds_it():
    for n, world in [(3, 2), (10, 3), (1000, 8), (7, 7), (1, 2)]:
        for r in range(world):
            lo, hi = distributed.Ranks(rank=r, world_size=world).part(n)
            assert all(distributed.Ranks(world_size=world).owner(i, n) == r for i in range(lo, hi))


def test_env_and_launch_refusals(monkeypatch, tmp_path):
    assert distributed.env_ranks({}) == distributed.SINGLE
    assert distributed.env_ranks({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == distributed.Ranks(1, 2, 1)
    with pytest.raises(ConfigError, match="RANK/WORLD_SIZE"):
        distributed.env_ranks({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="not integers"):
        distributed.env_ranks({"RANK": "x", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="^RANK: WORLD_SIZE=2 is set but RANK is not"):
        distributed.env_ranks({"WORLD_SIZE": "2"})
    assert distributed.env_ranks({"WORLD_SIZE": "1"}) == distributed.Ranks(0, 1, 0)
    from dpsynth.methods import registry
    from dpsynth.distributed.data_parallel import launch

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="^train.method:"):
        launch(workers.tiny(tmp_path, "train.method=gswgan_federated"), registry.data_parallel_methods(),
               torch.device("cpu"))


# --- (a) clipped sums, reduced: the 2-rank step is the 1-process step ---------------------------------
def test_two_ranks_take_the_one_process_step_on_the_same_logical_batch(tmp_path, small_mnist, ranks_ran):
    steps = DPGAN_STEPS
    r0, r1 = (torch.load(ranks_ran["dpgan"] / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert_same_models(r0, r1, rtol=0, atol=0)  # every rank applied the same update, bit for bit
    assert all(t for t in r0["takes"]) and all(t for t in r1["takes"])  # both ranks sampled records
    assert all(max(a) < 300 <= min(b) for a, b in zip(r0["takes"], r1["takes"]))  # each from its own part

    one = DPGANTrainer(workers.tiny(tmp_path / "one"), small_mnist, mechanism_seed=11)
    workers.noiseless(one)
    masks = []
    for a, b in zip(r0["takes"], r1["takes"]):
        m = torch.zeros(len(small_mnist), dtype=torch.bool)
        m[a + b] = True
        masks.append(m)
    union = iter(masks)
    one.state.mechanism.poisson_mask = lambda n, rate: next(union)
    for _ in range(steps):
        one.train_step()
    assert one.g_steps >= 1
    assert_same_models({"D": one.state.D.state_dict(), "G": one.state.G.state_dict()}, r0, rtol=1e-5, atol=1e-6)
    # and it is not the same model whatever the batch: a 1-process step on rank 0's half alone differs
    half = DPGANTrainer(workers.tiny(tmp_path / "half"), small_mnist, mechanism_seed=11)
    workers.noiseless(half)
    first = torch.zeros(len(small_mnist), dtype=torch.bool)
    first[r0["takes"][0]] = True
    half.state.mechanism.poisson_mask = lambda n, rate: first
    dpgan.d_step(half.state, half.draw(), half.sanitizer)
    one_step = DPGANTrainer(workers.tiny(tmp_path / "ref"), small_mnist, mechanism_seed=11)
    workers.noiseless(one_step)
    one_step.state.mechanism.poisson_mask = lambda n, rate: masks[0]
    dpgan.d_step(one_step.state, one_step.draw(), one_step.sanitizer)
    assert any(not torch.allclose(p, q, atol=1e-6) for p, q in zip(half.state.D.parameters(), one_step.state.D.parameters()))


# --- (b) the noise: once per logical step, full σC, from rank 0's stream -------------------------------
def test_the_noise_of_a_logical_step_is_added_once(ranks_ran):
    sigma, bound, draws, seed = NOISE.values()
    n0, n1 = (torch.load(ranks_ran["noise"] / f"noise{r}.pt", weights_only=False) for r in (0, 1))
    assert torch.equal(n0["noise"], n1["noise"])  # every rank holds the same noisy sum
    noise = n0["noise"]
    assert noise.numel() == draws * (40 * 25 + 25)
    # from rank 0's stream, drawn exactly as one process draws it: N(0, (σC)²) once, bit for bit
    coins = MechanismRandomness(seed=seed)
    std = sigma * bound
    expected = torch.stack([torch.cat([(coins.standard_normal((25, 40)) * std).reshape(-1),
                                       coins.standard_normal((25,)) * std]) for _ in range(draws)])
    assert torch.equal(noise, expected)
    # and empirically: variance (σC)² = 1, not 0 (no rank added noise) nor W·(σC)² = 2 (every rank did)
    var = noise.var().item()
    assert abs(var - (sigma * bound) ** 2) < 0.04, var  # 61 500 draws: the estimate's sd is 0.6 %
    assert n0["bytes"] == (40 * 25 + 25) * 4  # one all-reduce of the clipped sums, float32


# --- (c) one writer: rank 0 ----------------------------------------------------------------------------
def test_only_rank_zero_writes_and_the_trace_has_one_event_per_logical_step(ranks_ran):
    tmp_path = ranks_ran["own-dirs"]
    r0, r1 = (torch.load(tmp_path / f"final{r}.pt", weights_only=False) for r in (0, 1))
    assert r1["result"] is None and not (tmp_path / "out1").exists() and not (tmp_path / "mlflow1.db").exists()
    result = r0["result"]
    assert result.steps == 8 and Path(result.trace_path).exists() and Path(result.grid_path).exists()
    out0 = tmp_path / "out0"
    assert (out0 / "checkpoints" / "last.pt").exists() and (out0 / "grids" / "step-0000004.png").exists()
    assert (tmp_path / "mlflow0.db").exists() and result.mlflow_run_id
    trace = json.loads(Path(result.trace_path).read_text())
    warm, train = trace["events"]  # the warm-up's release, then one event per logical step: 8, not 16
    assert train["count"] == 8 and warm["count"] == 1 and trace["steps"] == 9
    assert r1["trace"] == r0["trace"] == trace  # every rank kept the same trace (rank 1 wrote none)
    assert_same_models(r0, r1, rtol=0, atol=0)  # and the same models: warm-up and all steps in lockstep


# --- (d) resume across world sizes -------------------------------------------------------------------------
def test_checkpoints_resume_across_world_sizes(tmp_path, small_mnist):
    q = 32 / 600
    # 2 ranks stop after 4 steps (checkpoint at 4); 1 process resumes and finishes
    two = tmp_path / "two"
    two.mkdir()
    workers.run_ranks(2, two, workers.train_shared_dir, str(two), 4)
    ckpt = torch.load(two / "out" / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["step"] == 4 and ckpt["trace"]["steps"] == 4
    one = DPGANTrainer(workers.tiny(two / "out"), small_mnist)
    result = one.train()
    trace = json.loads(Path(result.trace_path).read_text())
    assert trace["steps"] == 8 and trace["events"][0]["count"] == 8
    sigma = trace["events"][0]["noise_multiplier"]
    assert result.epsilon == pytest.approx(rdp_epsilon(sigma, q, 8), rel=1e-9)

    # 1 process stops after 4 steps; 2 ranks resume in the same output.dir and finish
    single = tmp_path / "single"
    DPGANTrainer(workers.tiny(single / "out"), small_mnist).train(stop_after=4)
    at4 = torch.load(single / "out" / "checkpoints" / "last.pt", weights_only=False)
    workers.run_ranks(2, single, workers.train_shared_dir, str(single), None)
    r0, r1 = (torch.load(single / f"shared{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["step"] == r1["step"] == 8 and r0["trace"] == r1["trace"]
    trace = json.loads((single / "out" / "trace.json").read_text())
    assert trace["events"][0]["count"] == 8 and trace["events"][0]["noise_multiplier"] == at4["trace"]["events"][0][
        "noise_multiplier"]
    done = json.loads((single / "out" / "result.json").read_text())
    assert done["epsilon"] == pytest.approx(rdp_epsilon(sigma, q, 8), rel=1e-9) == result.epsilon
    assert_same_models(r0, r1, rtol=0, atol=0)
    # rank 0 continued the checkpoint's secret stream; rank 1 drew its own, and never received rank 0's
    assert not torch.equal(r1["mechanism"]["state"], r0["mechanism"]["state"])


# --- dp-GAN (Zhang): the same four properties, with clip groups and per-unit fakes --------------------------------
def union_masks(takes0, takes1, n: int) -> list[torch.Tensor]:
    masks = []
    for a, b in zip(takes0, takes1):
        m = torch.zeros(n, dtype=torch.bool)
        m[a + b] = True
        masks.append(m)
    return masks


def replay(trainer, masks, latents, rhos) -> None:
    """Feed ``trainer``'s mechanism the given per-step masks, unit latents and interpolation weights."""
    masks, latents, rhos = iter(masks), iter(latents), iter(rhos)

    def take(n, rate):
        return next(masks)

    def normal(shape, **kw):
        out = next(latents)
        assert tuple(out.shape) == tuple(shape)
        return out

    def uniform(shape):
        out = next(rhos)
        assert tuple(out.shape) == tuple(shape)
        return out

    trainer.state.mechanism.poisson_mask, trainer.state.mechanism.standard_normal, trainer.state.mechanism.uniform = take, normal, uniform


@pytest.mark.parametrize("mode", ["ghost", "ew"])
def test_zhang_two_ranks_take_the_one_process_step_on_the_same_logical_batch(tmp_path, mode, ranks_ran):
    steps = ZHANG_STEPS
    r0, r1 = (torch.load(ranks_ran[f"zhang-{mode}"] / f"zrank{r}.pt", weights_only=False) for r in (0, 1))
    assert_same_models(r0, r1, rtol=0, atol=0)  # every rank applied the same update, bit for bit
    assert r0["groups"] == r1["groups"] and r0["bounds"] == r1["bounds"] and len(r0["groups"]) == 3
    assert r0["g_steps"] == r1["g_steps"] == 2
    cfg = workers.zhang_tiny(tmp_path / "one", f"train.grad_sample_mode={mode}")
    public, private = workers.zhang_data(cfg)
    half = len(private) // 2
    assert all(a and b and max(a) < half <= min(b) for a, b in zip(r0["takes"], r1["takes"]))  # each its own part
    assert [len(z) for z in r0["latents"]] == [len(t) for t in r0["takes"]]  # one latent per unit, its own coins

    masks = union_masks(r0["takes"], r1["takes"], len(private))
    latents = [torch.cat([a, b]) for a, b in zip(r0["latents"], r1["latents"])]
    rhos = [torch.cat([a, b]) for a, b in zip(r0["rhos"], r1["rhos"])]
    one = ZhangTrainer(cfg, private, public=public, mechanism_seed=11)
    workers.noiseless(one)
    replay(one, masks, latents, rhos)
    for _ in range(steps):
        one.train_step()
    assert one.state.groups == r0["groups"]
    assert one.sanitizer.bounds == pytest.approx(r0["bounds"], rel=1e-6)
    assert_same_models({"D": one.state.D.state_dict(), "G": one.state.G.state_dict()}, r0, rtol=1e-5, atol=1e-6)
    # and it is not the same model whatever the batch: without rank 1's units the first step differs
    half_run = ZhangTrainer(cfg, private, public=public, mechanism_seed=11)
    workers.noiseless(half_run)
    replay(half_run, union_masks(r0["takes"], [[]] * steps, len(private)), r0["latents"], r0["rhos"])
    half_run.train_step()
    whole = ZhangTrainer(cfg, private, public=public, mechanism_seed=11)
    workers.noiseless(whole)
    replay(whole, masks, latents, rhos)
    whole.train_step()
    assert any(not torch.allclose(p, q, atol=1e-6) for p, q in zip(half_run.state.D.parameters(), whole.state.D.parameters()))


def test_zhang_noise_is_added_once_per_group_with_the_full_variance(ranks_ran):
    draws, seed = ZHANG_NOISE.values()
    n0, n1 = (torch.load(ranks_ran["zhang-noise"] / f"znoise{r}.pt", weights_only=False) for r in (0, 1))
    assert len(n0["captured"]) == draws
    for a, b in zip(n0["captured"], n1["captured"]):  # every rank holds the same noisy sum and the same bounds
        assert a["bounds"] == b["bounds"] and all(torch.equal(x, y) for x, y in zip(a["grads"], b["grads"]))
    groups, names, sigma, batch = n0["groups"], n0["names"], n0["sigma"], 32
    assert len(groups) == 2 and sigma == 2.0  # weight_bias: weights, biases; σ per group
    # from rank 0's stream, drawn exactly as one process draws it: per group j, N(0, (σ c_j)²) once, bit for bit
    coins = MechanismRandomness(seed=seed)
    params = dict(zip(names, range(len(names))))
    normalised = []
    for step in n0["captured"]:
        coins.standard_normal((0, n0["latent_dim"]))  # the step's units: none
        coins.uniform((0,))
        for group, bound in zip(groups, step["bounds"]):
            for name in group:
                got = step["grads"][params[name]]
                expected = torch.zeros_like(got).add_(coins.standard_normal(got.shape) * (sigma * bound)) / batch
                assert torch.equal(got, expected), name
                normalised.append((got * batch / (sigma * bound)).reshape(-1))
    # and empirically: each group's noise is σ c_j, not 0 (no rank noised) nor √2 σ c_j (every rank did)
    z = torch.cat(normalised)
    assert z.numel() == draws * 9917
    var = z.var().item()
    assert abs(var - 1.0) < 0.03, var  # 119 004 draws: the estimate's sd is 0.41 %, the margin 7 sd
    assert len({tuple(s["bounds"]) for s in n0["captured"]}) > 1  # adaptive bounds, from rank 0's public batches
    assert n0["bytes"] == 9917 * 4  # one all-reduce of both groups' clipped sums, float32


# Slow tier (#35 item 5, ~1 min; as GS-WGAN's below): resuming across world sizes is
# test_checkpoints_resume_across_world_sizes (DPGAN); dp-GAN's two ranks taking the one-process step,
# test_zhang_two_ranks_take_the_one_process_step_on_the_same_logical_batch; its resume in one process,
# tests/methods/test_zhang.py::test_resume_equals_uninterrupted and test_contract's resume test.
@pytest.mark.slow
def test_zhang_checkpoints_resume_across_world_sizes(tmp_path):
    cfg = workers.zhang_tiny(tmp_path, "zhang.grouping=weight_bias", "privacy.noise_multiplier=3.0")
    public, private = workers.zhang_data(cfg)
    q, folded = 32 / len(private), 3.0 / 2 ** 0.5  # k = 2 groups of one step fold to σ/√k
    two = tmp_path / "two"
    two.mkdir()
    workers.run_ranks(2, two, workers.zhang_train_shared_dir, str(two), 4)
    ckpt = torch.load(two / "out" / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["step"] == 4 and ckpt["trace"]["steps"] == 4
    one = ZhangTrainer(workers.zhang_tiny(two / "out", "zhang.grouping=weight_bias", "privacy.noise_multiplier=3.0"),
                       private, public=public)
    result = one.train()
    trace = json.loads(Path(result.trace_path).read_text())
    assert trace["steps"] == 8 and trace["events"][0]["count"] == 8
    assert trace["events"][0]["noise_multiplier"] == pytest.approx(folded, rel=1e-12)
    assert result.epsilon == pytest.approx(rdp_epsilon(folded, q, 8), rel=1e-9)

    single = tmp_path / "single"
    ZhangTrainer(workers.zhang_tiny(single / "out", "zhang.grouping=weight_bias", "privacy.noise_multiplier=3.0"),
                 private, public=public).train(stop_after=4)
    workers.run_ranks(2, single, workers.zhang_train_shared_dir, str(single), None)
    r0, r1 = (torch.load(single / f"zshared{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["step"] == r1["step"] == 8 and r0["trace"] == r1["trace"] and r0["bounds"] == r1["bounds"]
    done = json.loads((single / "out" / "result.json").read_text())
    assert done["epsilon"] == pytest.approx(rdp_epsilon(folded, q, 8), rel=1e-9) == result.epsilon
    assert_same_models(r0, r1, rtol=0, atol=0)
    assert not torch.equal(r1["mechanism"]["state"], r0["mechanism"]["state"])  # rank 0's coins never left it


# --- `dpsynth train` on 2 ranks: one ledger attempt for the job ---------------------------------------------------
def train_argv(data, out, steps: int, checkpoint_every: int) -> list[str]:
    """``dpsynth train`` (no run directory: dpgan in ``out``), as every rank of the job runs it."""
    return ["train", "--set", f"data.uri={data}", "--set", f"output.dir={out}", "--set", "tracking.enabled=false",
            "--set", f"train.steps={steps}", "--set", "train.d_width=4", "--set", "train.g_width=4",
            "--set", "train.batch_size=32", "--set", f"output.checkpoint_every={checkpoint_every}",
            "--set", "privacy.delta=1e-4", "--set", "ledger.population_id=mnist600", "--set", "data.num_classes=10"]


# Slow tier (#53 item 5: one forked `dpsynth train` job per path in the quick tier): the same 2-rank job, one ledger
# attempt charged in full, runs quick in test_a_two_rank_job_killed_mid_run_resumes_in_one_process below; rank 0 alone
# printing, in tests/distributed/test_train_torchrun.py::test_torchrun_train_stage_end_to_end (the torchrun job and
# its forked rerun) and test_launch.py's TrainJob end to end; one event per logical step, in
# test_only_rank_zero_writes_and_the_trace_has_one_event_per_logical_step above.
@pytest.mark.slow
def test_a_two_rank_train_job_is_one_ledger_attempt(tmp_path, small_mnist, monkeypatch):
    """Each rank runs `dpsynth train --json` as torchrun starts it (RANK, WORLD_SIZE, LOCAL_RANK; forked here from
    one warm interpreter): rank 0 alone prints the result and is charged, once, for the trace of one event per
    logical step."""
    from dpsynth.data import write_parquet
    from tests.ledger_fixtures import budgeted_ledger

    ledger = budgeted_ledger(tmp_path, monkeypatch, "mnist600", epsilon=100.0)
    data = tmp_path / "d.parquet"
    write_parquet(small_mnist, str(data))
    ranks = workers.cli_ranks(2, tmp_path, [*train_argv(data, tmp_path / "run", 10, 5), "--json"])
    assert [code for code, _, _ in ranks] == [0, 0], [err[-3000:] for _, _, err in ranks]
    (_, out0, _), (_, out1, _) = ranks
    assert out1 == ""  # rank 0 alone printed
    result = json.loads(out0)
    assert result["steps"] == 10
    trace = json.loads(Path(result["trace_path"]).read_text())
    assert trace["events"][0]["count"] == 10
    (charged,) = ledger.history("mnist600")  # one attempt, not one per rank
    assert charged["status"] == "committed" and charged["epsilon_spent"] == pytest.approx(result["epsilon"], rel=1e-6)


def test_a_two_rank_job_killed_mid_run_resumes_in_one_process(tmp_path, small_mnist, monkeypatch, capsys):
    """SIGKILL to every rank of a 2-rank `dpsynth train` job (forked, as above) after its first checkpoint; `dpsynth
    train` in one process adopts the checkpoint (the ledger's lineage: rank 0 wrote it under the job's reservation)
    and finishes the trace. 40 steps: killed at its first checkpoint (step 10), the job still had 30 to go (over a
    CPU-second, far more than the 0.1 s between two looks for the checkpoint)."""
    from dpsynth.data import write_parquet
    from tests.ledger_fixtures import budgeted_ledger, kill_after_first_checkpoint

    steps = 40
    ledger = budgeted_ledger(tmp_path, monkeypatch, "mnist600", epsilon=100.0)
    data = tmp_path / "d.parquet"
    write_parquet(small_mnist, str(data))
    out = tmp_path / "run"
    train = train_argv(data, out, steps, 10)
    job = workers.start_ranks(2, tmp_path, workers.cli_rank, str(tmp_path), train)
    ckpt = kill_after_first_checkpoint(job, out)
    step_at_kill = torch.load(ckpt, weights_only=False)["step"]
    assert 0 < step_at_kill < steps and not (out / "result.json").exists()
    from dpsynth.cli import main

    capsys.readouterr()
    code = main([*train, "--json"])  # in this process: one process, as the job's ranks were not
    done = capsys.readouterr()
    assert code == 0, done.err[-3000:]
    result = json.loads(done.out)
    trace = json.loads(Path(result["trace_path"]).read_text())
    assert result["steps"] == steps and trace["events"][0]["count"] == steps
    assert result["epsilon"] == pytest.approx(rdp_epsilon(result["noise_multiplier"], 32 / 600, steps), rel=1e-9)
    killed, resumed = ledger.history("mnist600")  # the job's one attempt (charged in full), then the resumption
    assert killed["status"] == "committed" and killed["epsilon_spent"] == killed["epsilon_reserved"]
    assert resumed["status"] == "committed" and resumed["resumes_id"] == killed["id"]


# --- GS-WGAN / DPAC: the K shards and their discriminators spread over the ranks -----------------------------
def assert_same_tensors(a, b, **tol) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, **tol)


def assert_same_states(a: dict, b: dict, **tol) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("method", ["gswgan", "dpac"])
def test_gswgan_two_ranks_take_the_one_process_iterations(tmp_path, method, ranks_ran):
    """Rank 0 holds shard 0, rank 1 shards 1 and 2 (K = 3). With the noise off and on (rank 0's stream seeded as
    the one process's), 6 iterations on 2 ranks give the generator the one process's gradients: the owner of the
    drawn shard ran the critic steps (DPAC: and the classifier) and clipped, rank 0 added the noise once."""
    steps = GSWGAN_STEPS
    r0, r1 = (torch.load(ranks_ran[method] / f"gsteps{r}.pt", weights_only=False) for r in (0, 1))
    one_dir = tmp_path / "one"
    one_dir.mkdir()
    workers.gswgan_steps(0, str(one_dir), method, steps)  # this process, no process group: one process
    one = torch.load(one_dir / "gsteps0.pt", weights_only=False)
    for noise in (False, True):
        a, b, ref = r0[noise], r1[noise], one[noise]
        assert a["own"] == [0] and b["own"] == [1, 2] and ref["own"] == [0, 1, 2]
        # the same shards drawn, each by the rank holding it; both ranks drew some
        assert sorted(a["drawn"] + b["drawn"]) == sorted(ref["drawn"]) and a["drawn"] and b["drawn"]
        assert set(a["drawn"]) == {0} and set(b["drawn"]) <= {1, 2}
        # each rank keeps only its own discriminators and Adam states, equal to the one process's
        assert set(a["d_states"]) == {0} and set(b["d_states"]) == set(ref["d_states"]) - {0}
        assert set(a["opt_states"]) | set(b["opt_states"]) == set(ref["opt_states"])
        for k in ref["d_states"]:
            assert_same_states((a if k == 0 else b)["d_states"][k], ref["d_states"][k], rtol=1e-5, atol=1e-6)
        # every rank took the same generator steps, bit for bit; and the one process's, to 1e-6
        assert len(a["grads"]) == len(ref["grads"]) == steps
        for ga, gb, gref in zip(a["grads"], b["grads"], ref["grads"]):
            assert_same_tensors(ga, gb, rtol=0, atol=0)
            assert_same_tensors(ga, gref, rtol=1e-5, atol=1e-6)
        assert_same_states(a["G"], b["G"], rtol=0, atol=0)
        assert_same_states(a["G"], ref["G"], rtol=1e-5, atol=1e-6)
        assert a["bytes"] == 16 * 28 * 28 * 4  # one all-reduce of the B releases (float32)
    # the noise is there (the noisy first step's gradient is not the clipped one's) and it is rank 0's stream,
    # added once: each rank adding σC of its own, or none, would not give the one process's gradients above
    assert r0[True]["trace"] == one[True]["trace"] and r0[True]["trace"]["steps"] == steps
    first_noisy, first_clean = r0[True]["grads"][0], r0[False]["grads"][0]
    assert all(not torch.allclose(x, y, atol=1e-3) for x, y in zip(first_noisy, first_clean))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gswgan", "dpac"])
def test_gswgan_checkpoints_resume_across_world_sizes(tmp_path, method):
    """2 ranks stop after 4 of 8 iterations and 1 process finishes; 1 process stops after 4 and 2 ranks finish: both
    equal the uninterrupted one-process run (mechanism seed fixed), trace and ε included. The 2-rank checkpoint holds
    every shard's discriminator (gathered to rank 0)."""
    from dpsynth.methods import registry

    trainer = registry.get(method).trainer
    straight = trainer(workers.gswgan_tiny(tmp_path / "straight", f"train.method={method}"), workers.gswgan_shards(),
                       mechanism_seed=12)
    assert straight.train(stop_after=4) is None
    at4 = torch.load(tmp_path / "straight" / "checkpoints" / "last.pt", weights_only=False)
    expected = straight.train()
    assert expected.steps == 8

    two = tmp_path / "two"
    two.mkdir()
    workers.run_ranks(2, two, workers.gswgan_train_shared_dir, str(two), method, 4)
    ckpt = torch.load(two / "out" / "checkpoints" / "last.pt", weights_only=False)
    assert ckpt["step"] == 4 and ckpt["trace"] == at4["trace"]
    assert set(ckpt["d_states"]) == set(at4["d_states"]) and set(ckpt["opt_states"]) == set(at4["opt_states"])
    for k in at4["d_states"]:
        assert_same_states(ckpt["d_states"][k], at4["d_states"][k], rtol=1e-5, atol=1e-6)
    r0 = torch.load(two / "gshared0.pt", weights_only=False)
    assert set(r0["d_states"]) <= {0}  # rank 0 kept its own shard's discriminator only
    one = trainer(workers.gswgan_tiny(two / "out", f"train.method={method}"), workers.gswgan_shards(),
                  mechanism_seed=12)
    result = one.train()
    assert result.steps == 8 and result.epsilon == expected.epsilon
    assert json.loads(Path(result.trace_path).read_text()) == json.loads(Path(expected.trace_path).read_text())
    assert_same_states(one.state.G_ema.state_dict(), straight.state.G_ema.state_dict(), rtol=1e-5, atol=1e-6)

    single = tmp_path / "single"
    trainer(workers.gswgan_tiny(single / "out", f"train.method={method}"), workers.gswgan_shards(),
            mechanism_seed=12).train(stop_after=4)
    workers.run_ranks(2, single, workers.gswgan_train_shared_dir, str(single), method, None)
    s0, s1 = (torch.load(single / f"gshared{r}.pt", weights_only=False) for r in (0, 1))
    assert s0["step"] == s1["step"] == 8 and s0["trace"] == s1["trace"]
    assert set(s1["d_states"]) <= {1, 2} and set(s0["d_states"]) <= {0}  # the checkpoint's spread on resume
    done = json.loads((single / "out" / "result.json").read_text())
    assert done["epsilon"] == expected.epsilon
    assert json.loads((single / "out" / "trace.json").read_text()) == json.loads(Path(expected.trace_path).read_text())
    assert_same_states(s0["G"], s1["G"], rtol=0, atol=0)  # (G_ema's spectral norms: refreshed by rank 0's grid)
    assert_same_states(s0["G"], straight.state.G.state_dict(), rtol=1e-5, atol=1e-6)
    assert_same_states(s0["G_ema"], straight.state.G_ema.state_dict(), rtol=1e-5, atol=1e-6)
    final = torch.load(single / "out" / "checkpoints" / "last.pt", weights_only=False)  # written at step 8 on 2 ranks
    for k in final["d_states"]:
        assert_same_states(final["d_states"][k], straight.state.d_states[k], rtol=1e-5, atol=1e-6)
    assert set(final["d_states"]) == set(straight.state.d_states)


def test_gswgan_refusals_under_torchrun(monkeypatch):
    """More ranks than shards, and GS-WGAN's private warm-up (it reads every shard), are refused by name."""
    from dpsynth.methods import registry
    from dpsynth.distributed import data_parallel as methods_distributed
    from tests.methods.gswgan_helpers import tiny as gswgan_config

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="warmup.central_images"):
        methods_distributed.launch(gswgan_config("/tmp/unused", "warmup.central_images=true"),
                                   registry.data_parallel_methods(), torch.device("cpu"), sharded=True)
    monkeypatch.setattr(methods_distributed, "current", lambda: distributed.Ranks(rank=0, world_size=4))
    with pytest.raises(ConfigError, match="partition.num_shards"):
        from dpsynth.methods.gswgan import GSWGANTrainer

        GSWGANTrainer(workers.gswgan_tiny("/tmp/unused"), workers.gswgan_shards())
