"""The audit: :mod:`stage` (``dpsynth audit``) recomputes ε from the mechanism trace with independent accountants
and passes or fails the release; the empirical audit measures a lower bound on ε beside that upper bound —
:mod:`empirical` (its audit runs), :mod:`statistics` (the one-run bound), :mod:`canaries` (the canaries and the
public stand-ins), :mod:`warmup` (the warm-up releases' audit) and :mod:`report` (its report section and MLflow)."""
