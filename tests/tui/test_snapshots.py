"""Snapshots of every view at 80x24, 120x40 and 200x50, replaying the demo journal
(fixtures/journals/tui-demo.jrnl) to its end, and of the pop-ups at 80x24.

In each, the header's unmet demand, its two labelled costs and the allocator's state are checked whole
before the snapshot is taken. Update the snapshots after a deliberate change with
``pytest tests/tui --snapshot-update`` and review the SVGs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from tui.app import CoralTui
from tui.bus import ReplaySource
from tui.screens.form import CommandForm

from .helpers import DEMO, quiet, replay_app, until

pytestmark = pytest.mark.slow  # each replays the demo journal: about 10 s on two busy cores

Snap = Callable[..., bool]
SIZES = [(80, 24), (120, 40), (200, 50)]
VIEWS = ["1", "2", "3", "4", "5"]


async def replayed(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, CoralTui)
    await until(pilot, lambda: app.state.link.state == "replay-ended", "the replay to end")
    await pilot.pause(0.1)
    head = str(app.query_one("#status").render())
    for whole in ("unmet 0", "plan $17.78", "$15.92", "alloc"):
        assert whole in head, (whole, head)
    assert "run $15.92" in head or "running $15.92" in head, head


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("view", VIEWS, ids=["fleet", "models", "market", "plans", "events"])
def test_view(snap_compare: Snap, view: str, size: tuple[int, int]) -> None:
    keys = [view] if view != "2" else [view, "down"]
    assert snap_compare(replay_app(), press=keys, terminal_size=size, run_before=replayed)


def test_plan_detail_80x24(snap_compare: Snap) -> None:
    assert snap_compare(replay_app(), press=["4", "enter"], terminal_size=(80, 24), run_before=replayed)


def test_event_detail_80x24(snap_compare: Snap) -> None:
    assert snap_compare(replay_app(), press=["5", "down", "enter"], terminal_size=(80, 24), run_before=replayed)


def test_events_filtered(snap_compare: Snap) -> None:
    async def filtered(pilot: Pilot[Any]) -> None:
        await replayed(pilot)
        await pilot.press("5", "slash", *"n51")

    assert snap_compare(replay_app(), terminal_size=(80, 24), run_before=filtered)


class _Steerable(ReplaySource):
    """The demo journal, but not read-only, so that the steering forms open (nothing is sent)."""

    read_only = False


def test_form_refuses_a_negative_demand(snap_compare: Snap) -> None:
    async def filled(pilot: Pilot[Any]) -> None:
        await replayed(pilot)
        await pilot.press("2", "down", "d")
        form = pilot.app.screen
        assert isinstance(form, CommandForm)
        assert form.current() == {"deployment": "chat-8b", "rps": ""}  # blank beside the current override
        form.query_one("#field-rps", Input).value = "-3"
        await pilot.press("enter")
        assert form.error is not None and form.error.field == "rps"

    app = quiet(CoralTui(_Steerable(DEMO, speed=float("inf")), frame_s=0.02))
    assert snap_compare(app, terminal_size=(80, 24), run_before=filled)


def test_steer_menu(snap_compare: Snap) -> None:
    app = quiet(CoralTui(_Steerable(DEMO, speed=float("inf")), frame_s=0.02))
    assert snap_compare(app, press=["s"], terminal_size=(80, 24), run_before=replayed)
