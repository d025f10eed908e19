"""`python -m zoo <command>`: the `zoo` command (zoo.cli) where its script is not on PATH."""

import sys

from zoo.cli import main

if __name__ == "__main__":
    sys.exit(main())
