"""`python -m zoo.bench`."""

import sys

from zoo.bench.cli import main

sys.exit(main())
