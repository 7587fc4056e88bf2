"""The six pipeline stages — partition, warmstart, train, audit, sample, evaluate — each a CLI
entrypoint (``dpsynth <stage> --run-dir URI``) that reads its inputs by URI, writes its outputs
atomically with a JSON manifest, and logs one MLflow child run. See ``common`` for the protocol."""
