"""``coral up --tui``: the terminal UI in a process of its own, attached over the bus to the mesh.

The mesh and the UI then share neither an event loop nor a core. The parent (``coral up``) writes the
kernel's addresses and, with CURVE, the mesh's in-memory client keys as one JSON line into a pipe that
only the child inherits (never argv or the environment), and keeps its end open. The child runs
``coral tui`` attached to those addresses and quits, restoring the terminal, when it reads end of file
on the pipe: the parent closed it (the mesh stopped or failed) or died. Quitting the UI ends the child,
and the parent then stops the mesh; a UI that ends with a non-zero status is reported in one line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import termios
from collections.abc import Sequence
from typing import Any

import anyio

from coral.errors import CoralError
from coral.kernel import ClientKeys, Endpoints

GRACE_S = 5.0
"""How long a UI whose pipe was closed may take to quit before it is killed."""


def check_endpoints(endpoints: Endpoints | None) -> None:
    """Raise CoralError unless another process can reach the kernel at ``endpoints``."""
    if endpoints is None or endpoints.router.startswith("inproc://"):
        raise CoralError(
            "--tui: the UI runs in a process of its own and attaches over the bus; "
            "bind tcp://HOST:PORT or ipc://PATH (--bind), not inproc"
        )


def exit_text(rc: int) -> str:
    """A process's exit status in words (negative: the signal that ended it)."""
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


async def run_tui_process(endpoints: Endpoints, curve: ClientKeys | None, *, grace_s: float = GRACE_S) -> int:
    """Run the UI in a child process attached to ``endpoints`` until it exits; return its exit status.

    Cancelled (the mesh stopped or failed), it closes the pipe, waits up to ``grace_s`` for the UI to
    quit, and kills it past that."""
    check_endpoints(endpoints)
    saved = _terminal_modes()
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, (json.dumps(_config(endpoints, curve)) + "\n").encode())
        proc = await anyio.open_process(
            [sys.executable, "-m", "coral.cli.tui_process", str(read_end)],
            stdin=None,
            stdout=None,
            stderr=None,
            pass_fds=(read_end,),
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    try:
        return await proc.wait()
    finally:
        os.close(write_end)
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(grace_s):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            if proc.returncode is not None and proc.returncode < 0:
                _restore_terminal(saved)


def _terminal_modes() -> list[Any] | None:
    """The terminal's modes (None if stdin is no terminal), to put back after a UI killed in raw mode."""
    try:
        return termios.tcgetattr(sys.stdin.fileno())
    except (termios.error, OSError, ValueError):
        return None


def _restore_terminal(saved: list[Any] | None) -> None:
    """Put back what a UI killed by a signal left: its modes, the alternate screen, mouse reports, cursor."""
    if saved is None:
        return
    try:
        termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, saved)
        sys.stderr.write(_RESET)
        sys.stderr.flush()
    except (termios.error, OSError, ValueError):
        pass


_RESET = "\x1b[?1000l\x1b[?1003l\x1b[?1015l\x1b[?1006l\x1b[?2004l\x1b[?1049l\x1b[?25h"
"""Mouse reports and bracketed paste off, the main screen back, the cursor shown (xterm sequences)."""


def _config(endpoints: Endpoints, curve: ClientKeys | None) -> dict[str, Any]:
    keys = None
    if curve is not None:
        keys = {
            "name": curve.name,
            "server_public": curve.server_public.decode(),
            "public": curve.public.decode(),
            "secret": curve.secret.decode(),
        }
    return {"router": endpoints.router, "pub": endpoints.pub, "curve": keys}


def _read_config(fd: int) -> tuple[Endpoints, ClientKeys | None]:
    """The first line of the pipe (read byte by byte: nothing after it may be consumed)."""
    buf = bytearray()
    while not buf.endswith(b"\n"):
        b = os.read(fd, 1)
        if not b:
            raise CoralError("--tui: the mesh closed the UI's pipe before it said where to attach")
        buf += b
    cfg = json.loads(buf)
    k = cfg["curve"]
    curve = None
    if k is not None:
        curve = ClientKeys(k["name"], k["server_public"].encode(), k["public"].encode(), k["secret"].encode())
    return Endpoints(cfg["router"], cfg["pub"]), curve


def main(argv: Sequence[str]) -> int:
    """The child: ``python -m coral.cli.tui_process FD``."""
    # start-up cost: ``coral up`` imports this module for ``run_tui_process`` and never needs Textual
    from tui.app import run_tui

    fd = int(argv[0])
    try:
        endpoints, curve = _read_config(fd)
        return run_tui(endpoints, curve=curve, parent_fd=fd)
    except CoralError as exc:
        print(f"coral up: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
