"""The audit: :mod:`stage` (``dpsynth audit``) recomputes ε from the mechanism trace with independent accountants
and passes or fails the release; :mod:`empirical` measures a lower bound on ε beside that upper bound."""
