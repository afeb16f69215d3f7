"""`just bench sweep`: the savings study on `core` (`coral bench --sweep`), with the README's heatmap.

Regenerates the README's "When does Coral save money" figures: the table on stdout and the heatmap at
bench/results/sweep-core.png (extra arguments go to `coral bench --sweep`, e.g. `--quick`, `--json`).
"""

import sys
from pathlib import Path

from coral.cli import main

PLOT = Path(__file__).resolve().parent / "results" / "sweep-core.png"

if __name__ == "__main__":
    sys.exit(main(["bench", "--sweep", "--scenarios", "core", "--deadline", "5", "--plot", str(PLOT), *sys.argv[1:]]))
