"""The README cannot go stale: its commands are run and their output compared with what it shows.

- A line ``$ coral ...`` in a fenced block is run (with ``--store`` pointed at a store the test builds,
  ``COLUMNS=120``), and the block's following lines, up to the next ``$`` line or the fence, must match
  its output: line by line, right-stripped, where ``...`` inside a line stands for any text and a line
  that is ``...`` alone for any number of lines. A trailing ``# comment`` on the command is dropped.
- Every other ``coral ...`` command in the README, in a block or in inline code, must parse with the
  real argument parser (placeholders in capitals such as ``ID`` or ``FILE`` may fail their type check).
- The counts the README gives for the catalog are the catalog's, and its benchmark table, the justfile's
  bench comment and the files in ``bench/`` agree.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import sys
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from coral.catalog import load_catalog
from coral.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```[a-z]*\s*$")
INLINE = re.compile(r"`(coral [^`]+)`")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_.=/:,-]*$")


def blocks(text: str) -> list[list[str]]:
    """The fenced code blocks of a Markdown text, as lists of lines."""
    out: list[list[str]] = []
    cur: list[str] | None = None
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            if cur is None:
                cur = []
            else:
                out.append(cur)
                cur = None
        elif cur is not None:
            cur.append(line)
    return out


def examples(text: str) -> list[tuple[str, list[str]]]:
    """Each ``$ coral ...`` command of the README and the output lines it shows."""
    out: list[tuple[str, list[str]]] = []
    for block in blocks(text):
        for line in block:
            if line.startswith("$ "):
                out.append((line[2:].split("  #")[0].strip(), []))
            elif out and block and any(b.startswith("$ ") for b in block):
                out[-1][1].append(line)
    return out


def other_commands(text: str) -> list[str]:
    """Every ``coral ...`` command of the README that is not a ``$`` example."""
    cmds = [m.group(1) for m in INLINE.finditer(text)]
    for block in blocks(text):
        if any(b.startswith("$ ") for b in block):
            continue
        for line in block:
            for part in re.split(r"&&|\|", line.split(" #")[0]):
                part = part.strip().rstrip("&").strip()
                if part.startswith("coral "):
                    cmds.append(part)
    return cmds


def expand(cmd: str) -> list[str]:
    """A synopsis as the commands it stands for: ``coral templates build | list | show`` and
    ``coral catalog [gpus|nodes]`` name several."""
    m = re.search(r"\[([^\]]+)\]", cmd)
    if m:
        return [x for alt in m.group(1).split("|") for x in expand(cmd[: m.start()] + alt + cmd[m.end() :])]
    if " | " in cmd:
        first, *rest = cmd.split(" | ")
        head = first.rsplit(" ", 1)[0]
        return [first, *(f"{head} {alt.strip()}" for alt in rest)]
    return [cmd]


def matches(shown: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` lines fit the ``shown`` pattern (see the module docstring)."""
    shown = [s.rstrip() for s in shown]
    while shown and not shown[-1]:
        shown.pop()
    actual = [a.rstrip() for a in actual]
    while actual and not actual[-1]:
        actual.pop()

    def line_ok(pattern: str, line: str) -> bool:
        parts = [re.escape(p) for p in pattern.split("...")]
        return re.fullmatch(".*".join(parts), line) is not None

    def go(i: int, j: int) -> bool:
        if i == len(shown):
            return j == len(actual)
        if shown[i].strip() == "...":
            return any(go(i + 1, k) for k in range(j, len(actual) + 1))
        return j < len(actual) and line_ok(shown[i], actual[j]) and go(i + 1, j + 1)

    return go(0, 0)


def test_matches() -> None:
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(['"wall_s": ...,'], ['"wall_s": 1.5,'])
    assert not matches(["a", "c"], ["a", "b", "c"])
    assert not matches(["x ... y"], ["x 1 z"])


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readme") / "templates.sqlite"


def run(cmd: str, store: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(cmd)
    assert argv[0] == "coral"
    parser_args = build_parser().parse_args(argv[1:])
    if hasattr(parser_args, "store"):
        argv += ["--store", str(store)]
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "TERM": "dumb"}
    code = "import sys, coral.cli; sys.exit(coral.cli.main())"
    return subprocess.run(
        [sys.executable, "-c", code, *argv[1:]], capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200
    )


@pytest.mark.slow
def test_readme_examples_show_what_the_commands_print(store: Path) -> None:
    cases = examples(README.read_text())
    assert len(cases) >= 5
    for cmd, shown in cases:  # in order: the first build makes the store the later ones read
        res = run(cmd, store)
        assert res.returncode == 0, (cmd, res.stderr)
        assert matches(shown, res.stdout.splitlines()), (
            f"$ {cmd}\n--- README\n" + "\n".join(shown) + ("\n--- actual\n" + res.stdout)
        )


def test_every_other_readme_command_parses() -> None:
    parser = build_parser()
    cmds = [c for cmd in other_commands(README.read_text()) for c in expand(cmd)]
    assert len(cmds) > 20
    bad = []
    for cmd in cmds:
        try:
            argv = shlex.split(cmd)[1:]
        except ValueError:
            bad.append(f"{cmd}: not shell syntax")
            continue
        err = io.StringIO()
        try:
            with redirect_stderr(err):
                parser.parse_args(argv)
        except SystemExit as e:
            if e.code in (0, None):  # --help, --version
                continue
            message = err.getvalue()
            value = re.search(r"invalid (?:\w+ value|choice): '([^']*)'", message)
            missing = "required" in message or "expected one argument" in message  # a mention of the option
            if not ((value and PLACEHOLDER.match(value.group(1))) or missing):
                bad.append(f"{cmd}: {message.strip()}")
    assert bad == []


def test_catalog_counts() -> None:
    text = README.read_text()
    cat = load_catalog()
    m = re.search(r"(\d+) GPU types, (\d+) node types .*?, (\d+) regions .*?and (\d+) models", text, re.S)
    assert m is not None
    assert tuple(map(int, m.groups())) == (len(cat.gpus), len(cat.nodes), len(cat.regions), len(cat.models))


def test_benchmarks_listed_everywhere() -> None:
    text = README.read_text()
    table = set(re.findall(r"^\| `([a-z-]+)` \|", text.split("## Benchmarks")[1].split("\n## ")[0], re.M))
    files = {p.stem.replace("_", "-") for p in (ROOT / "bench").glob("*.py")} - {"bus-bench"}  # a library of bus
    assert table == files
    just = (ROOT / "justfile").read_text()
    comment = re.search(r"# run one benchmark: (.*)\nbench ", just)
    assert comment is not None
    assert {n.strip() for n in comment.group(1).split(",")} == files
