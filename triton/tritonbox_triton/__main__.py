"""`python -m tritonbox_triton serve`: the CLI where no console script is installed."""

import sys

from tritonbox_triton.cli import main

sys.exit(main())
