"""`just bench plan`: `coral bench` over core, extended and scarce (templates are built first if missing)."""

import sys

from coral.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
