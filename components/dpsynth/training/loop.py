"""One training loop for every method, readable top to bottom (the shape of nanoGPT's ``train.py``).

A method's file holds its paper's algorithm: step functions over a state dataclass (models, optimizers, RNGs,
schedules). Its trainer (a :class:`Trainer`) is a thin adapter: it builds that ``state``, its privacy plan
(:class:`~dpsynth.privacy.plan.PrivacyPlan`) and its sanitizer — which records each release's event in
``trainer.trace`` itself — and its ``train_step()`` draws the batch and calls the step functions: one private
step and the non-private steps that follow it. :func:`train` owns everything else, the same for every method:

    under torchrun: wrap the trainer once (dpsynth.distributed.data_parallel.join); ranks other than 0 follow
    restore the last checkpoint (output.resume); write config.yaml; open the MLflow run
    the private warm-up, when warmup.central_images is on and the trace is empty; checkpoint it
    while step < plan.steps:
        stop_after reached → return None                  (tests of interruption)
        the plan's guard refuses the next step → stop     (belt and braces: plan.steps obeys it)
        trainer.train_step()
        every output.log_every: ε and the trainer's progress metrics (MLflow, progress bar)
        every output.sample_every: a sample grid (sensitive zone only, never MLflow)
        every output.checkpoint_every: a checkpoint (+ a generator snapshot, where the state keeps them: DPGAN)
        a SIGTERM on any rank → checkpoint this step and stop, every rank after the same step
    finish: ε check, generator.pt, trace.json, samples.png, result.json, MLflow

What ``step`` counts — one private step, one event of the plan — per method (``Trainer.STEP``):

=================  ============================================================  ==================
method             one step                                                      ``train.steps``
=================  ============================================================  ==================
dpgan              one DP-SGD discriminator step (a generator step every n_D)    discriminator steps
zhang (dp-GAN)     one DP-SGD critic step (a generator step every n_critic)      critic steps
gswgan, dpac       one generator iteration (n_dis critic steps, B releases)      generator iterations
gswgan_federated   one generator iteration (n_dis rounds, n_dis·B releases)      generator iterations
=================  ============================================================  ==================

Checkpoints (:mod:`dpsynth.training.checkpoint`) hold ``Trainer.state_dict()``: the loop's own fields
(fingerprint, step, generator steps, σ, the trace) and the fields of the method's ``state``.
"""

from __future__ import annotations

import json
import math
import logging
import sys
import time
from dataclasses import asdict
from typing import Any, Callable
from pathlib import Path

import torch
from tqdm import tqdm

from dpsynth import storage, termination, tracking
from dpsynth.config import RunConfig
from dpsynth.errors import PrivacyError
from dpsynth.grids import class_grid
from dpsynth.distributed import data_parallel
from dpsynth.training import artifacts, checkpoint, result
from dpsynth.warmup import fit as warmup
from dpsynth.training.result import TrainResult, resolve_device
from dpsynth.models.dcgan import count_parameters
from dpsynth.privacy import MechanismTrace, get_accountant
from dpsynth.privacy.plan import PrivacyPlan
from dpsynth.mechanisms.mechanism import Mechanism
from dpsynth.mechanisms.randomness import MechanismRandomness

# a state dataclass's field {shard index: state}: under torchrun each rank holds its own shards' (a checkpoint gathers)
SPREAD = data_parallel.SPREAD
CHEAP_ACCOUNTANTS = ("rdp", "wor")  # ε at every log; others (PRV: seconds) every 10th log
_PLAN = "the privacy plan: from the configuration and n (public), before any step"


_log = logging.getLogger("dpsynth.train")

class Trainer:
    """What the loop needs of a method: a thin adapter over its paper's step functions. A subclass builds its
    ``state`` and sets ``plan`` (and ``num_classes``, ``n``) in its ``__init__`` after ``super().__init__``, and
    implements the methods marked *method*."""

    STEP = "private steps"  # the progress bar's name for one step (see the table above)
    NAME: str  # *method*: its name in the registry (its file's METHOD)
    # what its MLflow run may hold (the train stage's allow-list, checked by the audit): what the loop logs;
    # a method adds what its own hooks log (progress, final_metrics, derived_params)
    MLFLOW_KEYS = tracking.config_params() | tracking.LoggedKeys(
        metrics={"epsilon": "ε of the recorded trace by the method's accountant"},
        params={"derived.sample_rate": _PLAN, "derived.noise_multiplier": _PLAN, "derived.total_steps": _PLAN,
                "derived.records": "n, the training records' count (public in this design)",
                "derived.d_parameters": "model size (architecture)", "derived.g_parameters": "model size (architecture)"})

    MECHANISM: Mechanism  # *method*: its privacy mechanism (dpsynth.mechanisms): plan, sanitizer, accountant
    # *method*: the state its step functions take, a dataclass (models, optimizers, RNGs, schedules; G, D, rng and
    # mechanism, the secret coins, at least); a checkpoint holds its fields (checkpoint.capture_state)
    state: Any
    plan: PrivacyPlan
    num_classes: int
    n: int  # training records

    def __init__(self, cfg: RunConfig, *, spread: bool = False, parent_run_id: str | None = None,
                 run_tags: dict[str, str] | None = None):
        self.cfg, self.out = cfg, Path(cfg.output.dir)
        # MLflow: nest the run under a pipeline's parent run, add tags. Nothing before the gate: the
        # run gets no image, no model and no dataset hash (the sample stage logs them after the audit).
        self.parent_run_id, self.run_tags = parent_run_id, dict(run_tags or {})
        # spread: its method trains on the ranks of a torchrun job (its Method.data_parallel): rank r of W under
        # torchrun (dpsynth.distributed.data_parallel); else 0 of 1 (a process group of another kind, e.g. the
        # federated server's, is not a data-parallel job)
        self.dist = data_parallel.ranks(spread)
        self.device = self.dist.place(resolve_device(cfg.train.device))
        self.dataset_name = cfg.data.name
        self.accountant = get_accountant(self.MECHANISM.accountant(cfg))  # GS-WGAN's fixes its own: "wor"
        self.trace = MechanismTrace()  # the sanitizer records into it; restored in place on resume
        self.step = 0  # private steps taken (= events recorded after the plan's prefix)
        self.g_steps = 0  # generator steps taken
        self._epsilon_cache = (-1, 0.0)  # (trace steps, ε): PRV evaluations take seconds

    # --- the plan's shorthands ---------------------------------------------------------------
    @property
    def event(self):
        return self.plan.event

    @property
    def total_steps(self) -> int:
        return self.plan.steps

    @property
    def configured_steps(self) -> int:
        """The steps the configuration asks for (``train.steps``; Private Evolution: ``evolution.rounds``)."""
        return self.cfg.train.steps

    # --- the job a step is part of: one process is the paper's algorithm ------------------------------
    # A method calls these, never a rank: under torchrun the data-parallel wrapper (dpsynth.distributed.data_parallel,
    # which train() applies once) gives each rank its part of the logical batch and one noisy sum of the job.
    def secret_coins(self, seed: int | None = None) -> MechanismRandomness:
        """The mechanism's secret coins (``seed``: tests' replay only, distinct per rank; None: OS entropy)."""
        return MechanismRandomness(device=self.device, secure_mode=self.cfg.privacy.secure_mode,
                                   seed=self.dist.mechanism_seed(seed))

    def select(self, randomness, population: int):
        """This step's batch, drawn by the method's mechanism (:meth:`~dpsynth.mechanisms.mechanism.Mechanism.select`):
        a Poisson mask of ``range(population)`` (under torchrun the indices of this rank's part), one of
        ``population`` shards (rank 0's draw, the same on every rank), or every record."""
        return self.MECHANISM.select(self.plan, randomness, population, ranks=self.dist)

    def own_share(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Of tensors drawn in full (e.g. from the shared latent stream), the share this process computes."""
        return self.dist.share(*tensors)

    def chosen_once(self, choose: Callable[[], Any]) -> Any:
        """``choose()`` as one process computes it: on rank 0 only, its value sent to every rank (e.g. clip
        bounds from public data: every rank must clip to the bound rank 0 scales the noise by)."""
        return self.dist.from_main(choose() if self.dist.is_main else None)

    def hold_shards(self, shards: list) -> tuple[range, list]:
        """The K shards this process holds (all in one process) and each shard's (images, labels) on the device,
        None for another rank's (:func:`dpsynth.distributed.data_parallel.spread`)."""
        return data_parallel.spread(self.dist, shards, num_shards=self.cfg.partition.num_shards, device=self.device)

    def every_record(self, own: range, shards: list) -> tuple[torch.Tensor, torch.Tensor]:
        """The union of the shards (:meth:`hold_shards`), for the private warm-up, which reads every shard."""
        return data_parallel.every_record(own, shards)

    def hand_on(self, k: int, streams: list[torch.Generator], module: torch.nn.Module) -> None:
        """The public ``streams`` and ``module``'s buffers as the holder of shard k left them (one process: as
        they are)."""
        data_parallel.hand_on(self.dist, self.dist.owner(k, self.K), streams, module)

    # --- method: the algorithm ------------------------------------------------------------------
    def train_step(self) -> None:
        """*method*: draw the batch and call the step functions: one private step (its sanitizer records its
        event) and the non-private steps after it."""
        raise NotImplementedError

    def warm_up(self, records: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """The private warm-up before the first step, when ``warmup.central_images`` is on
        (:func:`dpsynth.warmup.fit.warm_up`): the central-image releases on ``records`` (images in [-1, 1], labels;
        None: the trainer's ``images`` and ``labels``), with the mechanism's secret coins, each recording its event
        in the trace; then G is fitted to them (post-processing)."""
        s = self.state
        images, labels = records if records is not None else (self.images, self.labels)
        warmup.warm_up(self.cfg, s.G, images, labels, num_classes=self.num_classes, randomness=s.mechanism,
                       trace=self.trace, generator=s.rng)

    def generator(self) -> tuple[torch.nn.Module, dict]:
        """The generator to release and its ``model`` record (class and keywords, see artifacts): ``G`` and its
        own record (DPGAN's and dp-GAN's DCGAN); GS-WGAN releases its EMA copy."""
        return self.state.G, self.state.G.describe()

    def derived_params(self) -> dict:
        """What the MLflow run records before the first step (data-independent: the plan, n, the sizes of
        the state's ``G`` and ``D``); a method adds its own."""
        return {"sample_rate": self.event.sample_rate, "noise_multiplier": self.event.noise_multiplier,
                "total_steps": self.total_steps, "records": self.n, "d_parameters": count_parameters(self.state.D),
                "g_parameters": count_parameters(self.state.G)}

    # --- method: what it reports (defaults) -----------------------------------------------------
    def progress(self) -> tuple[dict, dict]:
        """(progress-bar fields, MLflow metrics) at a log step, besides ε."""
        return {}, {}

    def grid(self):
        return class_grid(self.generator()[0], num_classes=self.num_classes)

    def published_epsilon(self) -> float | None:
        """The paper's (unsound) account of the steps taken, under ``privacy.accounting=as_published``."""
        return None

    def final_metrics(self) -> dict:
        """MLflow metrics at the end, besides ε; a key ``derived.*`` is a parameter known only at the end
        (data-independent: the federation's bytes per iteration)."""
        return {"noise_multiplier": self.event.noise_multiplier, "sample_rate": self.event.sample_rate,
                "generator_steps": self.g_steps}

    def details(self) -> dict:
        """``TrainResult.details``: method-specific, data-independent facts of the run (called once, at the end)."""
        return {}

    # --- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"fingerprint": self.cfg.fingerprint(), "step": self.step, "g_steps": self.g_steps,
                "noise_multiplier": self.plan.noise_multiplier, "trace": self.trace.to_dict(),
                **checkpoint.capture_state(self.state)}

    def load_state_dict(self, state: dict) -> None:
        if not math.isclose(state["noise_multiplier"], self.plan.noise_multiplier, rel_tol=1e-12):
            raise PrivacyError("checkpoint noise multiplier differs from this run's; refusing to resume")
        # a GS-WGAN checkpoint from before this loop has no g_steps: one generator step per step there
        self.step, self.g_steps = state["step"], state.get("g_steps", state["step"])
        self.trace.load_state_dict(state["trace"])  # in place: the sanitizer holds this trace
        checkpoint.restore_state(self.state, state)

    def epsilon_spent(self) -> float:
        """ε of the recorded trace by the method's accountant (cached per trace length)."""
        if self._epsilon_cache[0] != self.trace.steps:
            eps = self.accountant.epsilon(self.trace, delta=self.cfg.privacy.delta) if self.trace.steps else 0.0
            self._epsilon_cache = (self.trace.steps, eps)
        return self._epsilon_cache[1]

    def can_step(self) -> bool:
        """The plan's guard on the next step: on the paper's account when it guards that (as_published)."""
        guard, published = self.plan.guard, self.plan.published_event
        if guard is None:  # the sound ε is reported, not enforced (GS-WGAN as_published): plan.steps bounds it
            return True
        if published is None:
            return guard.can_step(self.trace)
        return guard.can_step(MechanismTrace([published.with_count(self.trace.steps)]) if self.trace.steps
                              else MechanismTrace())

    def train(self, *, stop_after: int | None = None) -> TrainResult | None:
        """Train to the step budget. ``stop_after`` ends early (tests of interruption); returns None then."""
        return train(self, stop_after=stop_after)


# --- the loop ---------------------------------------------------------------------------------------


def train(trainer: Trainer, *, stop_after: int | None = None) -> TrainResult | None:
    data_parallel.join(trainer)  # under torchrun: the trainer wrapped once (one noisy sum; the ranks agree)
    if not trainer.dist.is_main:  # ranks other than 0 under torchrun: the same steps, nothing written
        return data_parallel.follow(trainer, stop_after=stop_after)
    cfg, o = trainer.cfg, trainer.cfg.output
    started = time.monotonic()
    ckpt_dir = checkpoint.begin(trainer, cfg, trainer.out)  # resume, and write config.yaml
    data_parallel.sync_state(trainer)  # other ranks take rank 0's (resumed) state; a no-op in one process

    with result.mlflow_run(trainer, derived=trainer.derived_params()) as run:
        if trainer.trace.steps == 0 and cfg.warmup.central_images:
            trainer.warm_up()
            data_parallel.sync_state(trainer)  # the warm G, its latent RNG and the trace
            if o.checkpoint_every:
                checkpoint.save(ckpt_dir, data_parallel.checkpoint_state(trainer))
        bar = tqdm(total=trainer.total_steps, initial=trainer.step, desc=trainer.STEP, unit="step",
                   file=sys.stderr, mininterval=1.0, dynamic_ncols=True)
        # a SIGTERM waits for the step, its event in the trace, its checkpoint; it is raised when this block ends,
        # after the step every rank of a torchrun job agrees on (data_parallel.stop_requested)
        with termination.deferred():
            while trainer.step < trainer.total_steps:
                if stop_after is not None and trainer.step >= stop_after:
                    bar.close()
                    return None
                if not trainer.can_step():
                    break
                trainer.train_step()
                bar.update(1)
                step = trainer.step
                if o.log_every and step % o.log_every == 0:
                    log_progress(trainer, bar, run)
                if o.sample_every and step % o.sample_every == 0:  # sensitive zone only, never MLflow
                    artifacts.write_grid(trainer.out / "grids" / f"step-{step:07d}.png", trainer.grid())
                if o.checkpoint_every and step % o.checkpoint_every == 0:
                    save_checkpoint(trainer, ckpt_dir, step)
                if data_parallel.stop_requested(trainer):  # checkpoint the last step first
                    if o.checkpoint_every and step % o.checkpoint_every:
                        save_checkpoint(trainer, ckpt_dir, step)
                    _log.warning("stopped by SIGTERM after step %d%s; the attempt is charged for the steps it ran",
                                 step, ", checkpoint written" if o.checkpoint_every else "")
                    bar.close()
                    break
        bar.close()
        return finish(trainer, run, started)


def save_checkpoint(trainer: Trainer, ckpt_dir, step: int) -> None:
    if getattr(trainer.state, "keeps_snapshots", False):  # DPGAN's: the generator so far, with the ε spent so far
        # (before the checkpoint: a resumed run has the snapshot of every checkpoint it resumes; one past it is dropped)
        checkpoint.save_snapshot(ckpt_dir, step, generator_file(trainer, trainer.epsilon_spent()))
    checkpoint.save(ckpt_dir, data_parallel.checkpoint_state(trainer))


def log_progress(trainer: Trainer, bar, run) -> None:
    cheap = (trainer.accountant.name in CHEAP_ACCOUNTANTS
             or trainer.step % (10 * trainer.cfg.output.log_every) == 0)
    eps = trainer.epsilon_spent() if cheap else trainer._epsilon_cache[1]
    postfix, metrics = trainer.progress()
    bar.set_postfix(eps=f"{eps:.3f}", **postfix)
    if run is not None:
        tracking.log_run(trainer.MLFLOW_KEYS, metrics={"epsilon": eps, **metrics}, step=trainer.step)


def generator_file(trainer: Trainer, eps: float, **privacy) -> bytes:
    """The ``dpsynth.generator/1`` file of the trainer's generator now, bound to its trace."""
    p = trainer.cfg.privacy
    module, model = trainer.generator()
    return artifacts.generator_bytes(
        module.state_dict(), model=model, trace=trainer.trace,
        privacy={"epsilon": eps, "delta": p.delta, "accountant": trainer.accountant.name, "step": trainer.step,
                 **privacy})


def finish(trainer: Trainer, run, started: float) -> TrainResult:
    """The end of every run: ε check, generator.pt, trace.json, samples.png, result.json, MLflow."""
    cfg, p, out = trainer.cfg, trainer.cfg.privacy, trainer.out
    eps = trainer.epsilon_spent()
    published = trainer.published_epsilon()
    accounting = "sound" if published is None else "as_published"
    if published is None and eps > p.epsilon:  # cannot happen by construction; refuse to release if it ever does
        raise PrivacyError(f"privacy.epsilon: spent {eps} exceeds the target {p.epsilon}")
    details = trainer.details()
    generator_path, trace_path, grid_path = out / "generator.pt", out / "trace.json", out / "samples.png"
    grid = trainer.grid()  # before the generator file: GS-WGAN's grid refreshes G_ema's spectral norms
    privacy = {"accounting": accounting, **trainer.MECHANISM.privacy_record(cfg)}
    if published is not None:
        privacy.update(epsilon_as_published_unsound=published, sound=False)
    storage.write_bytes(generator_path, generator_file(trainer, eps, **privacy))
    storage.write_bytes(trace_path, artifacts.trace_bytes(trainer.trace))
    artifacts.write_grid(grid_path, grid)
    result = TrainResult(
        epsilon=eps, delta=p.delta, accountant=trainer.accountant.name, steps=trainer.step,
        generator_steps=trainer.g_steps, noise_multiplier=trainer.MECHANISM.reported_noise_multiplier(trainer.plan),
        sample_rate=trainer.event.sample_rate,
        stopped_by="steps" if trainer.total_steps == trainer.configured_steps else "budget",
        output_dir=str(out), generator_path=str(generator_path), trace_path=str(trace_path), grid_path=str(grid_path),
        mlflow_run_id=run.info.run_id if run is not None else None, seconds=time.monotonic() - started,
        accounting=accounting, epsilon_as_published_unsound=published, details=details)
    if run is not None:
        tracking.log_privacy(epsilon=eps, delta=p.delta, accountant=trainer.accountant.name, step=trainer.step)
        logged = trainer.final_metrics()
        metrics = {k: v for k, v in logged.items() if not k.startswith("derived.")}
        if published is not None:
            metrics["epsilon_as_published_unsound"] = published
        tracking.log_run(trainer.MLFLOW_KEYS, metrics=metrics, tags={"dpsynth.accounting": accounting},
                         params={k: v for k, v in logged.items() if k.startswith("derived.")})
        tracking.log_json(json.loads(trainer.trace.to_json()), "privacy/mechanism_trace.json", shape="trace")
    storage.write_text(out / "result.json", json.dumps(asdict(result), indent=2))
    return result
