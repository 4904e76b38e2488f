"""``python -m qkv``: the command line."""

import sys

from qkv.cli import main

sys.exit(main())
