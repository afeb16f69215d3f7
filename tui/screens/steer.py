"""The steering menu: every control action with its key."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, OptionList
from textual.widgets.option_list import Option

from tui.steering import ACTIONS


class SteerMenu(ModalScreen[str | None]):
    """Pick an action (arrows and Enter, or its key); dismisses with its name, or None."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def compose(self) -> ComposeResult:
        yield Footer(compact=True, show_command_palette=False)
        with Vertical(id="steer", classes="dialog"):
            yield Label("Steer the mesh", classes="dialog-title")
            options = []
            for a in ACTIONS.values():
                t = Text()
                t.append(f" {a.key} ", style="bold reverse")
                t.append(f" {a.title}", style="bold")
                t.append(f"  {a.help}", style="dim")
                options.append(Option(t, id=a.name))
            yield OptionList(*options, id="steer-options")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def on_key(self, event: events.Key) -> None:
        for a in ACTIONS.values():
            if event.character == a.key:
                event.stop()
                self.dismiss(a.name)
                return

    def action_cancel(self) -> None:
        self.dismiss(None)
