"""`python -m quantmatrix.cli`: the same as the `quantmatrix` script."""

import sys

from quantmatrix.cli import main

sys.exit(main())
