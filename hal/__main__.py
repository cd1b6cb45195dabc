"""``python -m hal`` runs the ``hal`` command line."""

import sys

from hal.cli import main

sys.exit(main())
