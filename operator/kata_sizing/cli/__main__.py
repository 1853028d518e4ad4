"""`python -m kata_sizing.cli`: the same as the `kata-sizing` console script's `cli.main`."""

import sys

from . import main

if __name__ == "__main__":  # importing the module (walking the package) runs nothing
    sys.exit(main())
