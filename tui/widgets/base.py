"""What every view shares: a reactive ``state`` that redraws it when what the view shows changed, and the
width its tables may take."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual import events
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import var
from textual.widgets import Static

from tui.model import State


class StateView(Vertical):
    """A view of the ``State``: setting ``state`` (the app does, while the view is visible) redraws it,
    unless what it shows (``inputs``) and its width are the same as at the last draw."""

    state: var[State | None] = var(None, always_update=True)
    _drawn: tuple[int, Sequence[object]] | None = None

    class DetailRequested(Message):
        """The operator asked to see one row (``kind``: event, plan or instance; ``key``) in full."""

        def __init__(self, kind: str, key: str) -> None:
            super().__init__()
            self.kind = kind
            self.key = key

    def watch_state(self, state: State | None) -> None:
        self._draw()

    def on_resize(self, event: events.Resize) -> None:
        self._drawn = None
        self._draw()

    def _draw(self) -> None:
        if self.state is None:
            return
        inputs = self.inputs(self.state)
        mark = (self.room, inputs) if inputs is not None else None
        if mark is not None and self._drawn is not None and same(self._drawn, mark):
            return
        try:
            self.show(self.state)
        except NoMatches:  # before the view's children are mounted, or while the app closes
            return
        self._drawn = mark

    def inputs(self, state: State) -> Sequence[object] | None:
        """The parts of ``state`` the view shows (None: all of it). When each is the same (or equal) as at
        the last draw, at the same width, setting ``state`` does not redraw the view."""
        return None

    def show(self, state: State) -> None:
        """Draw ``state``."""
        raise NotImplementedError

    @property
    def room(self) -> int:
        """The width the view's tables may take (the view's, or the screen's before the first layout)."""
        return self.size.width or self.app.size.width

    def detail(self, kind: str, key: Any) -> None:
        if key is not None:
            self.post_message(self.DetailRequested(kind, str(key)))


def same(a: tuple[int, Sequence[object]], b: tuple[int, Sequence[object]]) -> bool:
    """Whether two draws' (width, inputs) are the same: the same width, and each input the same object or
    an equal one (the reducer keeps what a message did not change, so most are the same object)."""
    return a[0] == b[0] and len(a[1]) == len(b[1]) and all(x is y or x == y for x, y in zip(a[1], b[1], strict=True))


class Line(Static):
    """A static text that is updated only when its content changes (an update re-lays the screen out)."""

    _shown: Any = None

    def set(self, content: Any) -> None:
        """Show ``content`` if it differs from what is shown."""
        if content != self._shown:
            self._shown = content
            self.update(content)
