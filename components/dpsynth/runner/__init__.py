"""The pipeline: the six stages in order under one MLflow parent run (:mod:`run`), and the stages' commands
(:mod:`cli`: ``dpsynth partition | pretrain | audit | sample | evaluate | pipeline``)."""
