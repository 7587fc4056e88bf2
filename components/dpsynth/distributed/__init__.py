"""Distribution, in one room: a job's ranks and how it is started.

* :mod:`ranks` — this process's place in a ``torchrun`` job (:class:`~dpsynth.distributed.ranks.Ranks`: its part of
  the records, its Poisson mask, broadcasts from rank 0, the check that every rank holds the same settings) and the
  noise of one DP-SGD step drawn once, on rank 0, before one SUM all-reduce
  (:class:`~dpsynth.distributed.ranks.NoiseOnRankZero`);
* :mod:`data_parallel` — the DDP-like wrapper of a data-parallel trainer: the sanitizer's reducer, rank 0's state
  handed to the others, the spread shards of GS-WGAN/DPAC gathered into one checkpoint, the other ranks' loop
  (:func:`~dpsynth.distributed.data_parallel.follow`) and the stop every rank agrees on
  (:func:`~dpsynth.distributed.data_parallel.stop_requested`);
* :mod:`federation` — the federated GS-WGAN's transport: the server (rank 0) and K clients over gloo;
* :mod:`launch` — the train stage started on several ranks: ``torchrun`` on this machine, or a Kubeflow TrainJob /
  PyTorchJob on Kubernetes.

Why the privacy of a job of N ranks is exactly one process's: docs/privacy.md, "One DP-SGD mechanism over many
ranks"; how to run one: docs/distributed.md.
"""
