"""The package contracts of DESIGN.md (``[tool.importlinter]`` in pyproject.toml): the tree keeps them, and
one import against any of them breaks `lint-imports`, which `just lint` and CI run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coral", "actors", "solvers", "tui")
LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def _tree(tmp: Path) -> Path:
    """A copy of the four packages' sources and pyproject.toml under ``tmp``."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "data"))
    shutil.copy(ROOT / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [LINT, "--config", "pyproject.toml", "--no-cache"]
    return subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=300)


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    out = _lint(_tree(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("coral/scenario.py", "import actors.base", "coral (outside the CLI"),
        ("coral/gateway/table.py", "from actors.router import Router", "coral (outside the CLI"),
        ("solvers/problem.py", "import anyio", "solvers are pure"),
        ("solvers/rules.py", "import coral.store", "solvers are pure"),
        ("actors/base.py", "import tui.state", "actors import coral and solvers"),
        ("tui/reducer.py", "import solvers.problem", "tui imports only coral"),
        ("tui/reducer.py", "import coral.cli", "tui imports only coral"),
        ("solvers/rules.py", "import solvers.fastplace", "no import cycles"),
        ("coral/engines/__init__.py", "import coral.vllm.engine", "no import cycles"),
        ("solvers/shapes/catalogue.py", "import solvers.shapes.search", "no import cycles"),
        ("coral/cli/up_status.py", "import coral.cli.resume", "no import cycles"),
    ],
)
def test_an_import_against_a_contract_breaks_it(tmp_path: Path, module: str, line: str, broken: str) -> None:
    tree = _tree(tmp_path)
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}  # against the contracts\n")
    out = _lint(tree)
    assert out.returncode != 0
    report = " ".join(out.stdout.split())
    verdicts = report[report.index(f"{broken}") :].split()
    assert next(w for w in verdicts if w in ("KEPT", "BROKEN")) == "BROKEN", out.stdout
