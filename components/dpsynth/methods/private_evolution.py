"""Private Evolution, as in Lin et al., "Differentially Private Synthetic Data via Foundation Model APIs 1: Images"
(ICLR 2024, Algorithm 1), with the public prior's renderer as the API (Sim-PE, "… APIs 3").

One step is one round: every private training record votes for its nearest candidate figure of its class, the
histogram of votes is released with Gaussian noise (one full-batch event in the trace), and the next candidates
are drawn by the thresholded noisy votes and varied (post-processing). The algorithm, its feature, its query and
its noise: :mod:`dpsynth.mechanisms.private_evolution`; its plan and statement: its
:data:`~dpsynth.mechanisms.histograms.PRIVATE_EVOLUTION` mechanism. The release is the last round's figures
and thresholded noisy votes, as a :class:`dpsynth.prior.release.FigurePainter` (the generator file's model); the
sample stage paints from it with a public seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dpsynth import tracking
from dpsynth.config import RunConfig
from dpsynth.data import ImageDataset
from dpsynth.mechanisms import private_evolution as pe
from dpsynth.mechanisms.histograms import PRIVATE_EVOLUTION
from dpsynth.mechanisms.randomness import MechanismRandomness
from dpsynth.methods.method import Audit, Method, require
from dpsynth.prior.release import FigurePainter
from dpsynth.training import checkpoint
from dpsynth.training.loop import Trainer

_PLAN = "the privacy plan: from the configuration and n (public), before any step"


@dataclass(eq=False, kw_only=True)
class EvolutionState:
    """What a Private Evolution run holds between rounds; a checkpoint holds its fields but the transient ones."""

    population: pe.Population  # the candidates, the public coins, the released histograms so far
    mechanism: MechanismRandomness  # the secret coins: the noise only (never evolution.seed)
    records: np.ndarray = field(metadata=checkpoint.TRANSIENT)  # the records' features (figure_map), per run
    labels: np.ndarray = field(metadata=checkpoint.TRANSIENT)


class PrivateEvolutionTrainer(Trainer):
    """Runs ``evolution.rounds`` rounds of Private Evolution on the training records; ``train()``
    (:mod:`dpsynth.training.loop`) runs it to the end. One step is one round."""

    STEP = "rounds"
    NAME = "private-evolution"
    MECHANISM = PRIVATE_EVOLUTION
    MLFLOW_KEYS = Trainer.MLFLOW_KEYS | tracking.LoggedKeys(metrics={
        "noise_multiplier": _PLAN, "threshold": "H = evolution.threshold · σ, votes (the plan's σ: public)"})

    def __init__(self, cfg: RunConfig, dataset: ImageDataset, *, parent_run_id: str | None = None,
                 run_tags: dict[str, str] | None = None, mechanism_seed: int | None = None):
        """``mechanism_seed``: tests only (replaying the mechanism); None draws it from OS entropy."""
        super().__init__(cfg, parent_run_id=parent_run_id, run_tags=run_tags)
        e = cfg.evolution
        self.num_classes = cfg.data.num_classes or dataset.num_classes
        self.n = len(dataset)
        self.size, self.channels = dataset.shape[0], dataset.shape[2]
        self.plan = PRIVATE_EVOLUTION.plan(cfg, self.n)
        self.threshold = PRIVATE_EVOLUTION.threshold(cfg, self.plan)
        self.state = EvolutionState(
            population=pe.start(num_classes=self.num_classes, candidates=e.candidates, seed=e.seed),
            mechanism=self.secret_coins(mechanism_seed),
            records=pe.FEATURES[e.feature](dataset.images), labels=np.asarray(dataset.labels))

    @property
    def configured_steps(self) -> int:
        return self.cfg.evolution.rounds

    def train_step(self) -> None:
        e, s = self.cfg.evolution, self.state
        every = self.select(s.mechanism, self.n)  # full batch: every record votes
        pe.evolve_round(s.population, s.records[every], s.labels[every], rounds=self.plan.steps,
                        noise_multiplier=self.plan.noise_multiplier, threshold=self.threshold,
                        randomness=s.mechanism, trace=self.trace, size=self.size,
                        steps=(e.step_first, e.step_last), fresh=e.fresh)
        self.step += 1

    def generator(self):
        """The release: the current population's figures and thresholded noisy votes, as a painter."""
        evolution = pe.released(self.state.population, self.threshold)
        painter = FigurePainter.from_figures(evolution.figures, evolution.weights, image_size=self.size,
                                             channels=self.channels, jitter=self.cfg.evolution.jitter)
        return painter, painter.describe()

    def derived_params(self) -> dict:
        return {"sample_rate": 1.0, "noise_multiplier": self.plan.noise_multiplier, "total_steps": self.plan.steps,
                "records": self.n}

    def final_metrics(self) -> dict:
        return {"noise_multiplier": self.plan.noise_multiplier, "threshold": self.threshold}


def validate(cfg: RunConfig) -> None:
    """Private Evolution's rules across sections."""
    require(not cfg.warmup.central_images, "warmup.central_images",
            "Private Evolution spends ε on its own rounds and reads no warm-up; set warmup.central_images=false "
            "(train.method=auto does so where it picks private-evolution)")


METHOD = Method("private-evolution", trainer=PrivateEvolutionTrainer, mechanism=PRIVATE_EVOLUTION,
                sections=("evolution",), empirical_audit=Audit.VOTES, validate=validate)
