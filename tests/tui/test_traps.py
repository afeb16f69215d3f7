"""Pilot tests for the traps an operator fell into, driven in tmux at 80x24 (issue 24), one test each.

Every test here failed against the TUI before the change (run against commit 019ab6e's ``tui/``, with
the same fake mesh): the events cursor stayed on an old row, Enter on Plans opened an old plan, forms came
pre-filled with the override, the pin form listed no templates, Enter on the forbid form's selector opened
its dropdown, typing after ``/`` fired hotkeys, Esc did not leave the filter, a pin was sent without a
confirmation, the header said nothing of a pending plan, of lag, of which cost it showed, and cut the
unmet demand at 80 columns, and the market summary was cut at 80 columns with no way to see it whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual import events
from textual.widgets import DataTable, Input

from coral.messages import ForbidTemplate, PinTemplate, SetDemand, SetSpeed
from tui.screens.confirm import ConfirmScreen
from tui.screens.form import CommandForm
from tui.screens.plan import PlanScreen

from .helpers import Live, live, replay_app, screen_text, until

pytestmark = pytest.mark.slow  # each drives a fake mesh from the keyboard: 10-20 s on two busy cores


def header(lv: Live) -> str:
    return str(lv.app.query_one("#status").render())


def cursor_key(lv: Live, table_id: str) -> str | None:
    table = lv.app.query_one(f"#{table_id}", DataTable)
    if not table.row_count:
        return None
    return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)


async def open_form(lv: Live, action: str, context: dict[str, str]) -> CommandForm:
    """Open a steering form and wait until a field of it has the focus (then keys go into it)."""
    lv.app.action_steer(action, context)
    await until(lv.pilot, lambda: isinstance(lv.app.screen, CommandForm), f"the {action} form")
    await until(lv.pilot, lambda: isinstance(lv.app.focused, Input), "a field to have the focus")
    form = lv.app.screen
    assert isinstance(form, CommandForm)
    return form


async def replan(lv: Live) -> None:
    seq = lv.last_plan_seq()
    await lv.pilot.press("r", "y")
    await lv.wait_plan(seq, "the re-plan")
    await lv.pilot.pause(0.1)


async def test_events_follow_the_newest_unless_scrolled_away(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        await lv.pilot.press("5")
        await lv.pilot.pause(0.1)
        await replan(lv)
        assert cursor_key(lv, "events-table") == str(lv.app.state.events[-1].n), "the newest event is selected"
        await lv.pilot.press("down", "down")
        held = cursor_key(lv, "events-table")
        await replan(lv)
        assert cursor_key(lv, "events-table") == held, "moved away: the cursor stays on its event"


async def test_enter_on_plans_opens_the_newest_plan(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        await lv.pilot.press("4")
        await lv.pilot.pause(0.1)
        await replan(lv)
        await replan(lv)
        await lv.pilot.press("enter")
        await until(lv.pilot, lambda: isinstance(lv.app.screen, PlanScreen), "the plan screen")
        screen = lv.app.screen
        assert isinstance(screen, PlanScreen)
        assert screen.plan.seq == lv.last_plan_seq()


async def test_a_form_shows_the_override_but_starts_blank_and_blank_is_not_clear(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        await open_form(lv, "demand", {"deployment": "chat-8b"})
        await lv.pilot.press(*"9", "enter")
        await until(lv.pilot, lambda: lv.app.state.deployments["chat-8b"].override, "the override")
        sent = len(lv.fake.received)
        form = await open_form(lv, "demand", {"deployment": "chat-8b"})
        assert form.query_one("#field-rps", Input).value == "", "not pre-filled with the override"
        assert "9" in str(form.query_one("#form-current").render()), "the current value is shown beside it"
        await lv.pilot.press("enter")
        assert form.error is not None and form.error.field == "rps", "blank is refused, not sent as a clear"
        assert len(lv.fake.received) == sent
        await lv.pilot.press("ctrl+u")  # the explicit Clear
        await until(lv.pilot, lambda: len(lv.fake.received) > sent, "the clear")
        assert lv.fake.received[-1] == SetDemand("chat-8b", None)


async def test_the_pin_form_lists_templates_with_mode_nodes_and_capacity(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        form = await open_form(lv, "pin", {"deployment": "chat-8b"})

        def listed() -> list[str]:
            return [str(o.prompt) for o in form.query_one("#form-templates").options]  # type: ignore[attr-defined]

        await until(lv.pilot, lambda: bool(form.query("#form-templates")) and "req/s" in " ".join(listed()), "list")
        lines = listed()
        assert lines and all(" agg " in line and "req/s" in line for line in lines), lines
        assert any("×" in line or "g6" in line for line in lines), "nodes are shown"


@pytest.mark.parametrize(("action", "context"), [("pin", {"deployment": "chat-8b"}), ("forbid", {})])
async def test_a_template_list_shows_the_capacity_the_mesh_answers_after_it_was_drawn(
    tmp_path: Path, action: str, context: dict[str, str]
) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        assert lv.inspector is not None
        lv.inspector.templates_delay_s = 1.0  # a loaded mesh: the list is drawn before the answer comes
        form = await open_form(lv, action, context)

        def listed() -> list[str]:
            return [str(o.prompt) for o in form.query_one("#form-templates").options]  # type: ignore[attr-defined]

        await until(lv.pilot, lambda: bool(form.query("#form-templates")) and "req/s" in " ".join(listed()), "list")
        await until(lv.pilot, lambda: not any("? req/s" in line for line in listed()), "every capacity", 10)
        for line in listed():
            t = lv.app.state.templates[lv.app.state.resolve_template(line.split()[0]) or ""]
            assert t.capacity_rps > 0 and f"{t.capacity_rps:.2f} req/s" in line, line


async def test_enter_on_the_forbid_form_sends_after_a_preview(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        tid = lv.app.state.plans[-1].instances[0].template_id
        await open_form(lv, "forbid", {"template_id": tid})
        await lv.pilot.press("tab", "enter")  # off the id, onto the next control: Enter still sends
        await until(lv.pilot, lambda: isinstance(lv.app.screen, ConfirmScreen), "the confirmation")
        await lv.pilot.press("y")
        await until(lv.pilot, lambda: bool(lv.fake.received), "the command")
        assert isinstance(lv.fake.received[-1], ForbidTemplate) and lv.fake.received[-1].forbid


async def test_keys_typed_after_slash_go_to_the_filter_and_esc_leaves_it(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        await lv.pilot.press("5")
        await lv.pilot.pause(0.1)
        # a lagging UI: the keys are all queued before the app handles the first (as the driver queues them)
        driver = lv.app._driver
        assert driver is not None
        for ch in "/chat-32b":
            key = events.Key("slash" if ch == "/" else ("minus" if ch == "-" else ch), ch)
            key.set_sender(lv.app)
            driver.send_message(key)
        box = lv.app.query_one("#events-filter", Input)
        await until(lv.pilot, lambda: box.value == "chat-32b", "the filter to read chat-32b", 5)
        assert not isinstance(lv.app.screen, CommandForm), "no hotkey fired"
        assert lv.app.state.command_count == 0
        await lv.pilot.press("escape")
        assert lv.app.focused is not box, "Esc leaves the filter box"
        assert isinstance(lv.app.focused, DataTable)


async def test_pin_asks_for_confirmation_with_the_allocators_preview(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        other = next(t for t in ("a1c8e3f0b2d4e6f8a0b2c4d6", "b7d2c1e9f3a5b7c9d1e3f5a7"))
        await open_form(lv, "pin", {"deployment": "chat-8b"})
        await lv.pilot.press(*other[:6], "enter")
        await until(lv.pilot, lambda: isinstance(lv.app.screen, ConfirmScreen), "a confirmation before the pin")
        assert not any(isinstance(m, PinTemplate) for m in lv.fake.received), "nothing sent yet"
        screen: Any = lv.app.screen
        await until(lv.pilot, lambda: "instances" in str(screen.query_one("#confirm-preview").render()), "preview")
        text = str(screen.query_one("#confirm-preview").render())
        assert "cost/h" in text and "unmet" in text
        await lv.pilot.press("y")
        await until(lv.pilot, lambda: any(isinstance(m, PinTemplate) for m in lv.fake.received), "the pin")


async def test_the_header_says_a_plan_is_pending_while_paused(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        await lv.pilot.press("p", "y")
        await until(lv.pilot, lambda: lv.app.state.paused, "the pause")
        assert "pending" not in header(lv)
        await open_form(lv, "demand", {"deployment": "chat-8b"})
        await lv.pilot.press(*"7", "enter")
        await until(lv.pilot, lambda: lv.app.state.deployments["chat-8b"].demand == 7.0, "the new demand")
        await lv.pilot.pause(0.1)
        assert "PAUSED" in header(lv) and "plan pending" in header(lv)


async def test_the_header_says_how_far_the_mesh_is_behind(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        await open_form(lv, "demand", {"deployment": "chat-32b"})
        seq = lv.last_plan_seq()
        await lv.pilot.press(*"500", "enter")  # demand left unmet: the header's longest first part
        await lv.wait_plan(seq)
        await lv.pilot.press("p", "y")
        await until(lv.pilot, lambda: lv.app.state.paused, "the pause")
        await open_form(lv, "demand", {"deployment": "chat-8b"})
        await lv.pilot.press(*"7", "enter")
        await until(lv.pilot, lambda: lv.app.state.plan_pending, "a plan pending")
        lv.fake.behind_s = 1234.0
        await until(lv.pilot, lambda: "1,234" in header(lv), "the lag in the header", 10)
        line = header(lv).splitlines()[0]
        unmet = sum(d.unmet for d in lv.app.state.deployments.values())
        for whole in (f"unmet {unmet:.0f} req/s", "plan $", "run $", "PAUSED", "lag 1,234s", "● live"):
            assert whole in line, (whole, line)  # at 80 columns the link keeps its name beside the lag
        assert "…" not in line, line


async def test_the_header_labels_cost_and_keeps_unmet_whole_at_80_columns(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        await open_form(lv, "demand", {"deployment": "chat-32b"})
        seq = lv.last_plan_seq()
        await lv.pilot.press(*"500", "enter")
        await lv.wait_plan(seq)
        await lv.pilot.pause(0.1)
        unmet = sum(d.unmet for d in lv.app.state.deployments.values())
        assert unmet > 100
        text = header(lv)
        assert f"unmet {unmet:.0f} req/s" in text, text
        assert "plan $" in text and ("running $" in text or "run $" in text), text


@pytest.mark.parametrize(("size", "rows"), [((80, 24), 1), ((60, 24), 2)], ids=["80x24", "60x24"])
async def test_the_market_summary_is_whole_at_80_columns_and_wraps_when_narrower(
    size: tuple[int, int], rows: int
) -> None:
    app = replay_app()
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.state.link.state == "replay-ended", "the replay to end")
        await pilot.press("3")
        await pilot.pause(0.1)
        screen = screen_text(app)
        top = next(i for i, line in enumerate(screen) if "10 offers" in line)
        shown = " ".join(line.strip() for line in screen[top : top + rows])
        assert shown == "10 offers  1 stockout  2 changed <60s  0 ⚑ operator  upd #2", screen
        assert screen[top + rows].split()[:2] == ["Region", "Node"], "the table starts right under the summary"


async def test_brackets_change_the_live_mesh_speed(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        await until(lv.pilot, lambda: lv.app.state.speed == 10.0, "the mesh's speed")
        assert "speed x10" in header(lv).splitlines()[1]
        await lv.pilot.press("right_square_bracket")
        await until(lv.pilot, lambda: "speed x20" in header(lv), "the faster speed on screen")
        assert lv.fake.received[-1] == SetSpeed(20.0) and lv.fake.speed == 20.0
        await lv.pilot.press("left_square_bracket", "left_square_bracket")
        await until(lv.pilot, lambda: lv.fake.received[-1] == SetSpeed(5.0), "two halvings")
        await until(lv.pilot, lambda: "speed x5" in header(lv), "the slower speed on screen")
        # the clock's mark with the new speed can reach the screen before the command's own answer
        await until(lv.pilot, lambda: all(c.status != "pending" for c in lv.app.state.commands), "the answers")
        assert [c.status for c in lv.app.state.commands] == ["ok"] * 3
