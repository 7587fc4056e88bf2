"""The method files make no rank calls (#53 item 2): a trainer asks the ``Trainer`` base for what one process would
do (its secret coins, the logical batch's Poisson mask, its share of the fakes, a value chosen once, the shards it
holds), and the loop wraps it once for a torchrun job (dpsynth.distributed.data_parallel). Only the file that places
the federated server and its clients on the job's ranks (methods/federated_processes.py) may speak of ranks."""

import re
from pathlib import Path

from dpsynth import methods

PLACES_PROCESSES = {"federated_processes.py"}
# a rank call: the trainer's ranks, the data-parallel module, the torch process group (the Method's
# ``data_parallel`` flag, a field a method declares, is not one)
RANK_CALLS = re.compile(r"self\.dist\b|(?<![.\w])data_parallel\b(?!\s*[:=])|dpsynth\.distributed|\bdistributed\.|"
                        r"torch\.distributed")


def test_no_method_file_calls_a_rank():
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted(Path(methods.__path__[0]).glob("*.py"))
             if path.name not in PLACES_PROCESSES
             for n, line in enumerate(path.read_text().splitlines(), 1) if RANK_CALLS.search(line)]
    assert found == []
