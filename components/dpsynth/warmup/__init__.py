"""The private warm-up before training (the ``warmup`` section; Li et al. 2025), every part of it in one room:

- :mod:`~dpsynth.warmup.central_images`: the Gaussian releases themselves (the class means, the style groups, the
  polarity shapes, the variation directions, the intensity histogram): each query, its sensitivity and its noise;
- :mod:`~dpsynth.warmup.releases`: which releases a configuration makes, their events, the trace prefix they form
  before training and what they are in a privacy statement (what a method's mechanism composes with its own);
- :mod:`~dpsynth.warmup.epsilon`: ``warmup.fit_epsilon``, the releases refitted to ``privacy.epsilon`` from the
  configuration alone (the configuration's validator applies it);
- :mod:`~dpsynth.warmup.fit`: the releases in the trace's order on the training records, and the generator fitted
  to them (post-processing): what a trainer's ``warm_up`` runs.

Its canary audit is the audit room's (:mod:`dpsynth.audit.warmup`): it needs the one-run bound and the secret
coins, which sit above this room (the configuration and every method's mechanism read the warm-up, so it sits
below them).
"""
