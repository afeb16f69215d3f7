"""What every view shares: a reactive ``state`` that redraws it, and the width its tables may take."""

from __future__ import annotations

from typing import Any

from textual import events
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.message import Message
from textual.reactive import var

from tui.model import State


class StateView(Vertical):
    """A view of the ``State``: setting ``state`` (the app does, while the view is visible) redraws it."""

    state: var[State | None] = var(None, always_update=True)

    class DetailRequested(Message):
        """The operator asked to see one row (``kind``: event, plan or instance; ``key``) in full."""

        def __init__(self, kind: str, key: str) -> None:
            super().__init__()
            self.kind = kind
            self.key = key

    def watch_state(self, state: State | None) -> None:
        self._draw()

    def on_resize(self, event: events.Resize) -> None:
        self._draw()

    def _draw(self) -> None:
        if self.state is None:
            return
        try:
            self.show(self.state)
        except NoMatches:  # before the view's children are mounted, or while the app closes
            return

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
