"""Same as `python -m zoo.sample`: generate text from a checkpoint."""

import sys

from zoo.sample import main

if __name__ == "__main__":
    sys.exit(main())
