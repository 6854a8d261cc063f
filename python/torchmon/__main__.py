"""``python -m torchmon``: the torchmon command line (see torchmon.cli)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
