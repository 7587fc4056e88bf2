"""The six pipeline stages — :mod:`partition`, :mod:`pretrain`, :mod:`train`, :mod:`audit`, :mod:`sample`,
:mod:`evaluate` — each a CLI entrypoint (``dpsynth <stage> --run-dir URI``) that reads its inputs by URI, writes its
outputs atomically with a JSON manifest, and logs one MLflow child run; and what they share: the protocol every stage
follows (:mod:`protocol`) and its manifests (:mod:`manifest`). :mod:`launch` starts the train stage on several ranks."""
