"""MLflow plugins of dpsynth: lineage tags (:mod:`.context`) and the Privacy ledger page (:mod:`.app`)."""
