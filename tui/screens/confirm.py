"""A yes/no question before a command is sent: re-plan, pause/resume, and pin, forbid and allow, which
first show the allocator's preview of the next plan (instances, cost, unmet demand)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Label, Static

from tui.model import PreviewView
from tui.widgets.bars import abbrev_mode, abbrev_nodes, abbrev_region, money, rate


def preview_text(p: PreviewView | None, error: str = "") -> Text:
    """The preview as a few lines: next plan against the latest, and the rows it would run."""
    out = Text()
    if p is None:
        if error:
            out.append(f"no preview: {error}", style="yellow")
        else:
            out.append("asking the allocator for a preview of the next plan…", style="dim")
        return out
    if not p.ok:
        out.append(f"the allocator would refuse it: {p.field}: {p.reason}", style="bold red")
        return out
    out.append("next plan (preview, not applied):\n", style="bold")

    def line(label: str, now: str, then: str, bad: bool = False) -> None:
        out.append(f"  {label:<10}", style="dim")
        out.append(f"{now:>12} → ")
        out.append(f"{then:<12}\n", style="bold red" if bad else "bold")

    line("instances", str(p.now_instances), str(p.instances))
    line("cost/h", money(p.now_cost_per_hour), money(p.cost_per_hour))
    line("unmet", f"{rate(p.now_unmet)} req/s", f"{rate(p.unmet)} req/s", p.unmet > 1e-9)
    out.append(f"  status {p.status}\n", style="dim")
    for r in p.rows[:8]:
        out.append(f"  {r.count:>3} × {r.deployment} {abbrev_mode(r.mode)} {abbrev_nodes(r.nodes)} ")
        out.append(f"{abbrev_region(r.region)}\n", style="dim")
    if len(p.rows) > 8:
        out.append(f"  … {len(p.rows) - 8} more rows\n", style="dim")
    return out


class ConfirmScreen(ModalScreen[bool]):
    """Dismisses with True (y, Enter on Yes) or False (n, Escape). With ``preview``, it shows the
    allocator's answer (``set_preview``) as it arrives."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No", priority=True),
    ]

    def __init__(self, title: str, question: str, *, preview: bool = False) -> None:
        super().__init__()
        self.title_text = title
        self.question = question
        self.preview = preview
        self.answer: PreviewView | None = None

    def compose(self) -> ComposeResult:
        yield Footer(compact=True, show_command_palette=False)
        with Vertical(id="confirm", classes="dialog popup"):
            yield Label(self.title_text, classes="dialog-title")
            yield Static(self.question, classes="dialog-help")
            if self.preview:
                yield Static(preview_text(None), id="confirm-preview")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Yes (y)", variant="primary", id="yes", compact=True)
                yield Button("No (n)", id="no", compact=True)

    def on_mount(self) -> None:
        self.set_focus(self.query_one("#yes", Button))

    def set_preview(self, answer: PreviewView | None, error: str = "") -> None:
        """Show the allocator's preview, or why none came."""
        self.answer = answer
        try:
            self.query_one("#confirm-preview", Static).update(preview_text(self.answer, error))
        except NoMatches:  # answered after the operator closed the question
            return

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
