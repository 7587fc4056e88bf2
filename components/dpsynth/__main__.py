"""``python -m dpsynth``: the ``dpsynth`` command."""

import sys

from dpsynth.cli import main

sys.exit(main())
