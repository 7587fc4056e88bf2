"""What an auditor reads of a release: the release card (:mod:`card`) and ``dpsynth release verify | keygen``
(:mod:`cli`)."""
