"""``python -m pootvk``: the console command (``devices``, ``demo``, ``bench``; see cli)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
