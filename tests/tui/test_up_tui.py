"""``coral up --tui``: the UI runs in a process of its own, attached to the mesh over the bus.

Each test starts ``coral up --tui`` on a pseudo-terminal of 80x24, as a user's shell would, and reads
what it draws: quitting the UI stops the mesh with status 0, the mesh stopping (``--for``) ends the UI,
and a UI killed by a signal stops the mesh and ends in one line that says so. No process is left behind.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

import coral.cli
from coral.cli.tui_process import exit_text
from tests.mesh.helpers import ROOT, World

pytestmark = pytest.mark.slow  # each starts coral up and a UI process: 10-30 s on two busy cores

ANSI = re.compile(r"\x1b\[[0-9;?<>=]*[A-Za-z]|\x1b[()][0-9A-Za-z]|\x1b[=>]")


class Terminal:
    """``coral up ARGS`` on a pseudo-terminal of 80x24; ``text`` is everything it wrote, escapes removed."""

    def __init__(self, store: Path, *args: str) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}
        cmd = [sys.executable, "-c", "import sys, coral.cli as c; sys.exit(c.main(sys.argv[1:]))", "up",
               "--scenario", "mesh-steady", "--store", str(store), "--no-build", "--speed", "10",
               "--bind", "tcp://127.0.0.1:0", "--tui", *args]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, start_new_session=True
        )
        os.close(slave)
        self.raw = b""

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode(errors="replace"))

    def read(self, until: float) -> None:
        while time.monotonic() < until:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if not ready:
                if self.proc.poll() is not None:
                    return
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the other side closed
                return
            if not chunk:
                return
            self.raw += chunk

    def wait_for(self, needle: str, timeout: float = 60.0) -> None:
        end = time.monotonic() + timeout
        while needle not in self.text and time.monotonic() < end and self.proc.poll() is None:
            self.read(min(end, time.monotonic() + 0.5))
        assert needle in self.text, f"{needle!r} not shown within {timeout}s; last output:\n{self.text[-2000:]}"

    def ui_pid(self) -> int:
        out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(self.proc.pid)], capture_output=True, text=True)
        pids = [int(line.split()[0]) for line in out.stdout.splitlines() if "coral.cli.tui_process" in line]
        assert len(pids) == 1, out.stdout
        return pids[0]

    def finish(self, timeout: float = 60.0) -> int:
        end = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < end:
            self.read(min(end, time.monotonic() + 0.5))
        self.read(time.monotonic() + 0.2)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"coral up did not end within {timeout}s; last output:\n{self.text[-2000:]}")
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.master)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def term(world: World) -> object:
    terms: list[Terminal] = []

    def start(*args: str) -> Terminal:
        terms.append(Terminal(world.store, *args))
        return terms[-1]

    yield start
    for t in terms:
        t.close()


def test_quitting_the_ui_stops_the_mesh(term: object) -> None:
    t = term()  # type: ignore[operator]
    t.wait_for("live")
    ui = t.ui_pid()
    assert ui != t.proc.pid, "the UI runs in a process of its own"
    os.write(t.master, b"q")
    assert t.finish() == 0, t.text[-2000:]
    assert "stopped" in t.text.splitlines()[-1] or "stopped" in t.text[-400:], t.text[-2000:]
    assert not alive(ui)


def test_the_mesh_stopping_ends_the_ui(term: object) -> None:
    t = term("--for", "12s")  # type: ignore[operator]
    t.wait_for("live")
    ui = t.ui_pid()
    assert t.finish() == 0, t.text[-2000:]
    assert not alive(ui)


def test_a_ui_killed_by_a_signal_stops_the_mesh_in_one_line(term: object) -> None:
    t = term()  # type: ignore[operator]
    t.wait_for("live")
    ui = t.ui_pid()
    os.kill(ui, signal.SIGKILL)
    assert t.finish() == 2, t.text[-2000:]
    # after the main screen is back (the UI's own exit, or coral up putting back what a killed UI left)
    after = ANSI.sub("", t.raw.rsplit(b"\x1b[?1049l", 1)[-1].decode(errors="replace"))
    lines = [line.strip() for line in after.splitlines() if line.strip()]
    assert lines == [f"coral: error: --tui: the terminal UI {exit_text(-9)}; the mesh was stopped"], after


def test_up_tui_refuses_an_inproc_kernel(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["up", "--scenario", "mesh-steady", "--store", str(world.store), "--no-build", "--tui", "--bind", "inproc"]
    assert coral.cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--tui" in err and "not inproc" in err, err
