"""``python -m envace_gym.cli``: the ``envace`` command (as ``accelerate launch -m`` runs it)."""

import sys

from .main import main

sys.exit(main())
