"""Shared by the TUI tests: a fake mesh with the TUI attached, waiting on the app, and the demo journal."""

from __future__ import annotations

import contextlib
import html
import math
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
from textual.pilot import Pilot

from coral.catalog import load_catalog
from coral.kernel import Endpoints, Mesh, read_journal
from tui.app import CoralTui
from tui.bus import LiveSource, ReplaySource

from .fake import FakeCoral, FakeInspector

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "fixtures" / "journals" / "tui-demo.jrnl"
GPU_OF = {name: n.gpu for name, n in load_catalog([]).nodes.items()}


def endpoints(tmp: Path) -> Endpoints:
    return Endpoints(f"ipc://{tmp}/bus.router", f"ipc://{tmp}/bus.pub")


def live_app(eps: Endpoints, ping_s: float = 0.1) -> CoralTui:
    """A TUI attached to ``eps``, pinging every ``ping_s`` (often: a lost mesh shows quickly)."""
    source = LiveSource(eps, ping_s=ping_s, ping_timeout_s=3.0, retry_s=0.1, handshake_s=2.0, request_timeout_s=5.0)
    return quiet(CoralTui(source, frame_s=0.02))


def replay_app(path: Path = DEMO, speed: float = math.inf) -> CoralTui:
    return quiet(CoralTui(ReplaySource(path, speed=speed), frame_s=0.02))


def quiet(app: CoralTui) -> CoralTui:
    """No animations and no blinking cursor (stable snapshots)."""
    app.animation_level = "none"
    app.blink = False
    return app


async def until(pilot: Pilot[Any], cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Let the app run until ``cond()`` holds; fail naming ``what`` if it does not within ``timeout``. It
    returns as soon as ``cond()`` holds: ``timeout`` only bounds a wait that would hang, so it is far above
    what a wait takes alone (10 s timed out at load 15-20)."""
    with anyio.move_on_after(timeout):
        while not cond():
            await pilot.pause(0.02)
        return
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@attrs.define
class Live:
    """A fake mesh with a TUI attached."""

    mesh: Mesh
    fake: FakeCoral
    app: CoralTui
    pilot: Pilot[Any]
    journal: Path
    inspector: FakeInspector | None = None

    def last_plan_seq(self) -> int:
        return self.app.state.plans[-1].seq if self.app.state.plans else 0

    async def wait_plan(self, after: int, what: str = "a new plan") -> None:
        await until(self.pilot, lambda: self.last_plan_seq() > after, what)

    async def wait_result(self, n: int) -> None:
        def done() -> bool:
            return any(c.n == n and c.status != "pending" for c in self.app.state.commands)

        await until(self.pilot, done, f"the answer to command {n}")

    def sent_on_bus(self, tag: str) -> list[Any]:
        """The control messages with ``tag`` the kernel routed (from the mesh's journal)."""
        assert self.mesh.journal is not None
        self.mesh.journal.flush()
        return [r.decode() for r in read_journal(self.journal) if r.tag == tag and r.kind in ("send", "request")]


@contextlib.asynccontextmanager
async def live(tmp: Path, size: tuple[int, int] = (120, 40), fake_name: str = "operator") -> AsyncIterator[Live]:
    """A mesh (journaled) with ``FakeCoral`` (as ``fake_name``) and a TUI attached, once the TUI has the
    first plan."""
    journal = tmp / "bus.jrnl"
    eps = endpoints(tmp)
    async with Mesh(endpoints=eps, journal=journal) as mesh:
        app = live_app(eps, ping_s=1.0)  # little background work: the pilot's waits for idle return soon
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.state.link.state == "connected", "the TUI to connect")
            fake = FakeCoral(fake_name)
            await mesh.spawn(fake)
            inspector = FakeInspector(fake) if fake_name != "allocator" else None
            if inspector is not None:
                await mesh.spawn(inspector)
            await until(pilot, lambda: bool(app.state.plans) and bool(app.state.instances), "the first plan")
            yield Live(mesh, fake, app, pilot, journal, inspector)


def screen_text(app: CoralTui) -> list[str]:
    """The lines of the screen as the terminal shows them, rebuilt from Textual's own screenshot (SVG:
    one ``<text>`` per styled run, at column x / cell width, on its ``terminal-line-N``)."""
    svg = app.export_screenshot()
    cell = 12.2  # the screenshot's cell width in pixels
    rows: dict[int, dict[int, str]] = {}
    for x, line, text in re.findall(r'<text class="[^"]*" x="([^"]*)" y="[^"]*" textLength="[^"]*" '
                                    r'clip-path="url\(#terminal-(?:\w+-)?line-(\d+)\)">(.*?)</text>', svg):  # fmt: skip
        col = round(float(x) / cell)
        for k, ch in enumerate(html.unescape(text)):
            rows.setdefault(int(line), {})[col + k] = " " if ch == "\xa0" else ch
    return ["".join(r.get(c, " ") for c in range(max(r) + 1)).rstrip() for _, r in sorted(rows.items())]
