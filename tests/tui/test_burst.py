"""Keys that arrive together (typed while the UI lagged, or sent by tmux) take effect in the order typed.

Before ``tui/keys.py`` the first and the third failed: the Tab's focus move ran after the keys behind it had
been sent to the field it left (``chat-8b20``, as ``just bench tui-steer`` saw at load 19), and a key typed
after Enter went into the closing form. The second passed then (the app put text that reached it into the
focused box) and failed with Tab made a priority binding alone: it guards the way from a hotkey to its form.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual import events
from textual.widgets import Input

from coral.messages import SetDemand
from tui.screens.confirm import ConfirmScreen
from tui.screens.form import CommandForm

from .helpers import Live, live, until

pytestmark = pytest.mark.slow

NAMES = {"-": "minus", "\t": "tab", "\n": "enter", ".": "full_stop", "\x1b": "escape"}


def burst(lv: Live, text: str) -> None:
    """Queue every key of ``text`` before the app handles the first (as the driver queues them)."""
    driver = lv.app._driver
    assert driver is not None
    for ch in text:
        key = events.Key(NAMES.get(ch, ch), ch if ch.isprintable() else None)
        key.set_sender(lv.app)
        driver.send_message(key)


async def test_a_tab_in_a_burst_moves_on_before_the_next_keys(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        lv.app.action_steer("demand")
        await until(lv.pilot, lambda: isinstance(lv.app.focused, Input), "a field to have the focus")
        form = lv.app.screen
        assert isinstance(form, CommandForm)
        burst(lv, "chat-8b\t20")
        await lv.pilot.pause(0.5)
        assert form.current() == {"deployment": "chat-8b", "rps": "20"}


async def test_keys_typed_right_after_the_hotkey_go_into_its_form(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        burst(lv, "dchat-8b\t20\n")
        await until(lv.pilot, lambda: any(isinstance(m, SetDemand) for m in lv.fake.received), "the demand")
        assert lv.fake.received[-1] == SetDemand("chat-8b", 20.0)


async def test_a_key_typed_after_enter_goes_past_the_closing_form(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        burst(lv, "dchat-8b\t20\np")
        await until(lv.pilot, lambda: isinstance(lv.app.screen, ConfirmScreen), "the pause's confirmation")
        screen = lv.app.screen
        assert isinstance(screen, ConfirmScreen) and screen.title_text.startswith("Pause"), "p went past the form"
        await until(lv.pilot, lambda: screen.is_mounted and bool(lv.fake.received), "the demand")
        assert lv.fake.received == [SetDemand("chat-8b", 20.0)]


async def test_esc_leaves_a_form_with_text_in_it_and_sends_nothing(tmp_path: Path) -> None:
    async with live(tmp_path, size=(80, 24)) as lv:
        burst(lv, "dchat-8b")
        await until(lv.pilot, lambda: isinstance(lv.app.screen, CommandForm), "the demand form")
        form = lv.app.screen
        assert isinstance(form, CommandForm)
        await until(lv.pilot, lambda: form.is_mounted and form.current()["deployment"] == "chat-8b", "the text")
        burst(lv, "\x1bp")  # Esc, then a hotkey of the view under the form
        await until(lv.pilot, lambda: isinstance(lv.app.screen, ConfirmScreen) and lv.app.screen.is_mounted, "pause")
        assert lv.fake.received == [] and lv.app.state.command_count == 0, "Esc sent nothing"
