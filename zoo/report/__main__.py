import sys

from zoo.report.cli import main

sys.exit(main())
