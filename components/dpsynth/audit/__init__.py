"""The empirical audit, a measured lower bound on ε beside the audit stage's upper bound (the audit stage,
``dpsynth audit``, is :mod:`dpsynth.stages.audit`): :mod:`empirical` (its audit runs), :mod:`statistics` (the one-run
bound), :mod:`canaries` (the canaries and the public stand-ins), :mod:`warmup` (the warm-up releases' audit) and
:mod:`report` (its report section and MLflow figures)."""
