"""One event, plan row or instance in full, in a pop-up sized to its text."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, Static

from tui.model import State
from tui.widgets.bars import clock, rate, stage_bar, stage_summary
from tui.widgets.events import SEVERITY_STYLE


class DetailScreen(ModalScreen[None]):
    """Shows ``body`` whole (wrapped, scrollable); Esc, q or Enter closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,enter", "close", "Close", priority=True)]

    def __init__(self, title: str, body: Text | str) -> None:
        super().__init__()
        self.title_text = title
        self.body = body

    def compose(self) -> ComposeResult:
        yield Footer(compact=True, show_command_palette=False)
        with VerticalScroll(id="detail", classes="dialog popup"):
            yield Label(self.title_text, classes="dialog-title")
            yield Static(self.body, id="detail-body")

    def action_close(self) -> None:
        self.dismiss(None)


def details(state: State, kind: str, key: str) -> tuple[str, Text] | None:
    """The title and full text of an event (``key``: its number) or an instance (its id), or None."""
    if kind == "event":
        e = next((e for e in reversed(state.events) if str(e.n) == key), None)
        if e is None:
            return None
        body = Text()
        body.append(f"{clock(e.t)}  {e.kind} · {e.severity} · from {e.source}\n\n", style="dim")
        body.append(e.text, style=SEVERITY_STYLE.get(e.severity, ""))
        return f"Event #{e.n}", body
    if kind == "instance":
        i = state.instances.get(key)
        if i is None:
            return None
        tpl = state.templates.get(i.template_id)
        body = Text()
        for label, value in (
            ("deployment", i.deployment),
            ("state", f"{i.state} since {clock(i.since)}"),
            ("mode", i.mode),
            ("region", i.region),
            ("capacity", f"{rate(i.weight)} req/s"),
            ("template", i.template_id),
            ("model", tpl.model if tpl else "?"),
            ("nodes", ", ".join(i.node_types)),
            ("layers", stage_summary(tpl, i.node_types, state.gpu_of)),
        ):
            body.append(f"{label:<11}", style="dim")
            body.append(f"{value}\n")
        body.append_text(stage_bar(tpl, i.node_types, state.gpu_of, 40))
        return f"Instance {i.id}", body
    return None
