"""`python -m kata_sizing.cli`: the same as the `kata-sizing` console script's `cli.main`."""

import sys

from . import main

sys.exit(main())
