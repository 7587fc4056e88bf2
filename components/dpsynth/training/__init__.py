"""What every training method shares: the one loop (:mod:`loop`), its checkpoints, the artifacts it writes, its
result record and MLflow run (:mod:`result`); its ranks under ``torchrun`` are :mod:`dpsynth.distributed`'s."""
