"""The steering form: one per action, validated against what the TUI knows before anything is sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Button, Footer, Input, Label, Select, Static

from tui.state import ACTIONS, FieldSpec, FormError, State, build_command, suggestions


class CommandForm(ModalScreen[Any]):
    """Fill in a control command; dismisses with the command, or None when cancelled.

    Invalid input (a negative number, an unknown name) is refused here with the field and the reason,
    and nothing is sent.
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, state_fn: Callable[[], State], action: str, values: dict[str, str]) -> None:
        super().__init__()
        self.state_fn = state_fn
        self.action_name = action
        self.spec = ACTIONS[action]
        self.values = values
        self.error: FormError | None = None

    def compose(self) -> ComposeResult:
        state = self.state_fn()
        yield Footer(compact=True, show_command_palette=False)
        with VerticalScroll(id="form", classes="dialog"):
            yield Label(f"{self.spec.title}  [dim]({self.spec.key})[/]", classes="dialog-title")
            yield Static(self.spec.help, classes="dialog-help")
            for f in self.spec.fields:
                with Horizontal(classes="field"):
                    yield Label(f.label, classes="field-label")
                    yield self._field(state, f)
            yield Static("", id="form-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Send (Enter)", variant="primary", id="send", compact=True)
                yield Button("Cancel (Esc)", id="cancel", compact=True)

    def _field(self, state: State, f: FieldSpec) -> Input | Select[str]:
        value = self.values.get(f.name, "")
        if f.kind == "choice":
            return Select(
                [(c, c) for c in f.choices],
                value=value or f.choices[0],
                allow_blank=False,
                id=f"field-{f.name}",
                compact=True,
            )
        names = suggestions(state, f.name, self.values)
        return Input(
            value=value,
            placeholder=f.placeholder or ("required" if not f.optional else ""),
            suggester=SuggestFromList(names, case_sensitive=True) if names else None,
            id=f"field-{f.name}",
            compact=True,
        )

    def on_mount(self) -> None:
        """Focus the first empty input, else the first value to change (a number), else the first field."""
        inputs = [(f, self.query_one(f"#field-{f.name}")) for f in self.spec.fields]
        empty = [w for _, w in inputs if isinstance(w, Input) and not w.value]
        numbers = [w for f, w in inputs if isinstance(w, Input) and f.kind in ("number", "int")]
        for w in (*empty, *numbers, *(w for _, w in inputs)):
            w.focus()
            return

    def current(self) -> dict[str, str]:
        """What the form holds now."""
        out = {}
        for f in self.spec.fields:
            w = self.query_one(f"#field-{f.name}")
            if isinstance(w, Input):
                out[f.name] = w.value
            elif isinstance(w, Select):
                out[f.name] = str(w.value) if isinstance(w.value, str) else ""
        return out

    def on_input_changed(self, event: Input.Changed) -> None:
        event.input.remove_class("-invalid")
        if event.input.id == "field-region" and any(f.name == "node" for f in self.spec.fields):
            names = suggestions(self.state_fn(), "node", self.current())
            self.query_one("#field-node", Input).suggester = SuggestFromList(names, case_sensitive=True)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "send":
            self.submit()
        else:
            self.dismiss(None)

    def submit(self) -> None:
        """Validate; dismiss with the command, or show why it is refused."""
        try:
            cmd = build_command(self.state_fn(), self.action_name, self.current())
        except FormError as exc:
            self.error = exc
            self.query_one("#form-error", Static).update(f"[b]{exc.field}[/b]: {exc.reason}")
            for w in self.query(f"#field-{exc.field}"):
                w.add_class("-invalid")
                w.focus()
            return
        self.error = None
        self.dismiss(cmd)

    def action_cancel(self) -> None:
        self.dismiss(None)
