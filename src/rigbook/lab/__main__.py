"""python -m rigbook.lab ARGS: the same as `provision lab ARGS`."""

import sys

from rigbook.lab.cli import main

sys.exit(main(sys.argv[1:]))
