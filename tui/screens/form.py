"""The steering form: one per action, validated against what the TUI knows before anything is sent.

It shows what the setting is now (``steering.current``) above blank fields, and a Clear button where the
action can remove a setting: a blank field is refused, never taken as a clear. Pin, forbid and allow list
the templates they can act on, with mode, nodes and capacity; choosing one (Enter) fills the field and
sends. Enter sends from any field; Esc always cancels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Button, Footer, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from tui.model import State, TemplateView
from tui.steering import ACTIONS, FieldSpec, FormError, build_command, current, suggestions, template_choices
from tui.widgets.bars import abbrev_mode, abbrev_nodes, rate


def template_line(t: TemplateView, forbidden: bool) -> Text:
    """``ab12cd34  agg  2×g6e.xl  12.3 req/s  qwen3-14b`` for a template list."""
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append(f"{t.id[:8]} ", style="bold")
    out.append(f"{abbrev_mode(t.mode):<4}", style="cyan" if t.mode == "aggregated" else "magenta")
    out.append(f"{abbrev_nodes(t.nodes):<22} ")
    out.append(f"{rate(t.capacity_rps) if t.capacity_rps else '?':>7} req/s ", style="bold")
    if forbidden:
        out.append("forbidden ", style="red")
    elif not t.usable:
        out.append("not usable now ", style="yellow")
    out.append(t.model, style="dim")
    return out


class CommandForm(ModalScreen[Any]):
    """Fill in a control command; dismisses with the command, or None when cancelled.

    Invalid input (a negative number, an unknown name, a blank field) is refused here with the field and
    the reason, and nothing is sent.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", priority=True),
        Binding("ctrl+u", "clear", "Clear", show=False, priority=True),
    ]

    def __init__(self, state_fn: Callable[[], State], action: str, values: dict[str, str]) -> None:
        super().__init__()
        self.state_fn = state_fn
        self.action_name = action
        self.spec = ACTIONS[action]
        self.values = values
        self.error: FormError | None = None
        self._choices: list[str] | None = None
        self._lines: list[str] = []

    def compose(self) -> ComposeResult:
        state = self.state_fn()
        yield Footer(compact=True, show_command_palette=False)
        with VerticalScroll(id="form", classes="dialog form"):
            yield Label(f"{self.spec.title}  [dim]({self.spec.key})[/]", classes="dialog-title")
            yield Static(self.spec.help, classes="dialog-help")
            yield Static("", id="form-current", classes="form-current")
            for f in self.spec.fields:
                with Horizontal(classes="field"):
                    yield Label(f.label, classes="field-label")
                    yield self._field(state, f)
            if self.spec.preview:
                yield OptionList(id="form-templates")
            yield Static("", id="form-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Send (Enter)", variant="primary", id="send", compact=True)
                if self.spec.clearable is not None:
                    yield Button(f"{self.spec.clear_label} (^U)", variant="warning", id="clear", compact=True)
                yield Button("Cancel (Esc)", id="cancel", compact=True)

    def _field(self, state: State, f: FieldSpec) -> Input:
        names = suggestions(state, f.name, self.values)
        return Input(
            value=self.values.get(f.name, ""),
            placeholder=f.placeholder or "required",
            suggester=SuggestFromList(names, case_sensitive=True) if names else None,
            id=f"field-{f.name}",
            compact=True,
        )

    def on_mount(self) -> None:
        """Focus the first empty input, else the first number, else the first field."""
        self.refresh_state()
        inputs = [(f, self.query_one(f"#field-{f.name}", Input)) for f in self.spec.fields]
        empty = [w for _, w in inputs if not w.value]
        numbers = [w for f, w in inputs if f.kind in ("number", "int")]
        for w in (*empty, *numbers, *(w for _, w in inputs)):
            self.set_focus(w)
            return

    def refresh_state(self) -> None:
        """Redraw what depends on the mesh's state: the current setting and the template list."""
        state = self.state_fn()
        try:
            vals = self.current()
            shown = self.query_one("#form-current", Static)
        except NoMatches:  # the state changed before the form was wholly composed: on_mount draws it
            return
        now = current(state, self.action_name, vals)
        shown.update(Text(now, style="bold") if now else "")
        if not self.spec.preview:
            return
        ts = template_choices(state, self.action_name, vals)
        ids = [t.id for t in ts]
        lines = [template_line(t, t.id in state.forbidden) for t in ts]
        if (ids, [ln.plain for ln in lines]) == (self._choices, self._lines):
            return  # redrawn when a line changes too: capacities come from the mesh after the list is drawn
        same = ids == self._choices
        self._choices, self._lines = ids, [ln.plain for ln in lines]
        ol = self.query_one("#form-templates", OptionList)
        held = ol.highlighted if same else None  # only the figures changed: the cursor stays
        ol.clear_options()
        ol.add_options([Option(line, id=t.id) for t, line in zip(ts, lines, strict=True)])
        if not ts:
            ol.add_option(Option(Text("no template to choose (yet)", style="dim"), disabled=True))
        else:  # Enter on the list chooses what the field names (or the first): never a surprise
            typed = vals.get("template_id", "").strip()
            tid = state.resolve_template(typed) if typed else None
            ol.highlighted = held if held is not None else ids.index(tid) if tid in ids else 0
        ol.border_title = f"{len(ts)} templates: mode, nodes, capacity per instance"

    def current(self) -> dict[str, str]:
        """What the form holds now."""
        return {f.name: self.query_one(f"#field-{f.name}", Input).value for f in self.spec.fields}

    def on_input_changed(self, event: Input.Changed) -> None:
        event.input.remove_class("-invalid")
        if event.input.id == "field-region" and any(f.name == "node" for f in self.spec.fields):
            names = suggestions(self.state_fn(), "node", self.current())
            self.query_one("#field-node", Input).suggester = SuggestFromList(names, case_sensitive=True)
        self.refresh_state()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id:
            self.query_one("#field-template_id", Input).value = event.option.id
            self.submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "send":
            self.submit()
        elif event.button.id == "clear":
            self.submit(clear=True)
        else:
            self.dismiss(None)

    def submit(self, *, clear: bool = False) -> None:
        """Validate; dismiss with the command, or show why it is refused."""
        try:
            cmd = build_command(self.state_fn(), self.action_name, self.current(), clear=clear)
        except FormError as exc:
            self.error = exc
            self.query_one("#form-error", Static).update(f"[b]{exc.field}[/b]: {exc.reason}")
            for w in self.query(f"#field-{exc.field}"):
                w.add_class("-invalid")
                self.set_focus(w)
            return
        self.error = None
        self.dismiss(cmd)

    def action_clear(self) -> None:
        if self.spec.clearable is not None:
            self.submit(clear=True)

    def action_cancel(self) -> None:
        self.dismiss(None)
