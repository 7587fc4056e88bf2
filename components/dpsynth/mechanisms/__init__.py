"""The privacy mechanisms: what touches the data and how its noise is drawn.

:mod:`dpsgd` and :mod:`ghost` sanitize per-example parameter gradients (DP-SGD, with or without per-example
gradients), :mod:`grouping` is dp-GAN's parameter grouping, and :mod:`randomness` the mechanism's secret noise
(one mechanism over the ranks of a ``torchrun`` job: :mod:`dpsynth.distributed`). Their accounting is
:mod:`dpsynth.privacy`'s; the private warm-up's Gaussian releases are :mod:`dpsynth.warmup`'s.
"""
