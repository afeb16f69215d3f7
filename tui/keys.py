"""Keys in the order typed: the app sends a key on only once the key before it has been handled.

Textual sends each key to the widget that has the focus when the app takes the key from the terminal, but
runs a key's ordinary binding (Tab's focus move, a hotkey that opens a form) only once the key has bubbled
up from that widget to the app, through one message queue per ancestor. Keys typed while the UI lagged
arrive together, so they overtook the binding: the Tab meant to move from a form's deployment field to its
next field was run after the ``20`` behind it had been sent to the deployment field (``chat-8b20``).

``OrderedKeysApp`` holds each key until the one before it has come to the end of its route and the screen on
top has mounted (a form has focused its field). A key that the focused widget takes as text (a character in a
text box) moves no focus, so the keys behind it follow at once: a burst of text is typed in one go, not one
screen redraw per character. A marker posted to the same widget right behind the key
bubbles up the same queues after it; back at the app, it goes round once more, behind what the key's
handling posted on the way (Enter's ``Input.Submitted``, which closes a form: a key typed after Enter goes to
what the form leaves focused, not into the closing form). A marker whose route was taken down (its widget
left the screen) releases the keys when that is seen, and no key waits longer than ``KEY_WAIT_S``.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TypeVar

from textual import events
from textual.app import App
from textual.dom import DOMNode
from textual.message import Message
from textual.timer import Timer

R = TypeVar("R")

KEY_WAIT_S = 3.0
"""The longest a key waits for the one before it (its marker lost in a way the app cannot see)."""
POLL_S = 0.02
"""How often a held key looks again at a screen still mounting or a marker's route."""
LAPS = 2
"""How many times a marker goes up the key's route before the next key is sent."""


class KeyRouted(Message):
    """Posted behind key ``n`` to the widget it was sent to (``lap`` times): back at the app, the key and
    what its handling posted on the way were handled."""

    def __init__(self, n: int, lap: int = 1) -> None:
        super().__init__()
        self.n = n
        self.lap = lap


class OrderedKeysApp(App[R]):
    """An app that sends each key to the focus only after the previous key was handled (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._held: deque[events.Key] = deque()
        self._keys_sent = 0
        self._in_flight: tuple[int, DOMNode, float] | None = None
        """The key being handled: its number, the widget it was sent to, when (``time.monotonic``)."""
        self._key_timer: Timer | None = None

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and not event.is_forwarded and self.screen_stack:
            self._held.append(event)
            await self._send_keys()
            return
        await super().on_event(event)

    async def _send_keys(self) -> None:
        """Send the held keys on, one at a time, while none is in flight and the top screen has mounted."""
        while self._held and self._in_flight is None:
            if not self.screen_stack:  # the app has closed
                self._held.clear()
                return
            if not self.screen.is_mounted:
                self._poll()
                return
            key = self._held.popleft()
            target = self.focused or self.screen
            await super().on_event(key)  # a priority binding, or sent to ``target`` (marked forwarded)
            if key.is_forwarded and not target.check_consume_key(key.key, key.character):
                self._keys_sent += 1
                self._in_flight = (self._keys_sent, target, time.monotonic())
                if not target.post_message(KeyRouted(self._keys_sent)):
                    self._in_flight = None
                else:
                    self._poll()

    def _poll(self) -> None:
        if self._key_timer is None:
            self._key_timer = self.set_timer(POLL_S, self._look_again)

    async def _look_again(self) -> None:
        self._key_timer = None
        if self._in_flight is not None:
            _, target, sent = self._in_flight
            if target.is_attached and time.monotonic() - sent < KEY_WAIT_S:
                self._poll()
                return
            self._in_flight = None
        await self._send_keys()

    async def on_key_routed(self, message: KeyRouted) -> None:
        message.stop()
        if self._in_flight is None or self._in_flight[0] != message.n:
            return
        target = self._in_flight[1]
        if message.lap < LAPS and target.is_attached and target.post_message(KeyRouted(message.n, message.lap + 1)):
            return
        self._in_flight = None
        await self._send_keys()
