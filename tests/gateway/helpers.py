"""Shared by the gateway tests."""

from __future__ import annotations


def sse(raw: bytes) -> list[str]:
    """The data lines of an SSE body, checking the framing (``data: ...`` events ending in a blank line)."""
    text = raw.decode()
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[len("data: ") :] for e in events]
