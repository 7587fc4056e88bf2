"""What every training method shares: the one loop (:mod:`loop`), its checkpoints, the artifacts it writes, its
result record and MLflow run (:mod:`core`), and its ranks under ``torchrun`` (:mod:`distributed`)."""
