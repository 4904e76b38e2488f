"""``python -m qkv``: the command line."""

from qkv.cli import run

run()
