"""Reader for request traces in the Azure LLM inference CSV format: TIMESTAMP,ContextTokens,GeneratedTokens.

Rows are streamed, never all held. Timestamps become seconds since the first row. A malformed row is an
error naming the file, line and reason (``on_bad_row="stop"``), or is skipped and counted
(``on_bad_row="skip"``). Timestamps must not go backwards.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import attrs

from coral.errors import CoralError

HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


class TraceError(CoralError):
    """A trace file is malformed; the message names the file and line."""


@attrs.frozen
class TraceStats:
    """Summary of a trace: request count, span, rate and mean lengths."""

    requests: int
    span_s: float
    mean_in: float
    mean_out: float
    skipped: int

    @property
    def rate(self) -> float:
        return self.requests / self.span_s if self.span_s > 0 else float(self.requests)


def _parse_ts(raw: str) -> float:
    """Seconds, from either a number or an Azure ``YYYY-MM-DD HH:MM:SS[.fffffff]`` timestamp (as UTC)."""
    s = raw.strip()
    try:
        return float(s)
    except ValueError:
        pass
    if "." in s:
        head, frac = s.split(".", 1)
        s = f"{head}.{frac[:6]}"
        return datetime.strptime(s, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()
    return datetime.strptime(s, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def iter_trace(
    path: Path, *, on_bad_row: str = "stop", skipped: list[int] | None = None
) -> Iterator[tuple[float, int, int]]:
    """Yield (seconds since the first request, prompt tokens, output tokens) per row."""
    if on_bad_row not in ("stop", "skip"):
        raise TraceError(f"on_bad_row must be 'stop' or 'skip', got {on_bad_row!r}")
    try:
        f = path.open(newline="")
    except OSError as e:
        raise TraceError(f"{path}: cannot open trace: {e.strerror}") from None
    with f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != HEADER:
            raise TraceError(f"{path}:1: header must be {','.join(HEADER)}, got {header}")
        t0: float | None = None
        last = float("-inf")
        for lineno, row in enumerate(reader, start=2):
            try:
                if len(row) != 3:
                    raise ValueError(f"expected 3 fields, got {len(row)}")
                try:
                    ts = _parse_ts(row[0])
                except ValueError:
                    raise ValueError(f"TIMESTAMP {row[0]!r} is not a timestamp") from None
                tin, tout = _count(row[1], "ContextTokens"), _count(row[2], "GeneratedTokens")
                if ts < last:
                    raise ValueError(f"TIMESTAMP {row[0]!r} goes back in time (out of order)")
            except ValueError as e:
                if on_bad_row == "skip":
                    if skipped is not None:
                        skipped.append(lineno)
                    continue
                raise TraceError(f"{path}:{lineno}: {e}") from None
            last = ts
            if t0 is None:
                t0 = ts
            yield ts - t0, tin, tout


def _count(raw: str, field: str) -> int:
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{field} {raw!r} is not an integer") from None
    if v < 0:
        raise ValueError(f"{field} {v} is negative")
    return v


def trace_stats(path: Path, *, on_bad_row: str = "stop") -> TraceStats:
    """One streaming pass over a trace."""
    n, s_in, s_out, last = 0, 0, 0, 0.0
    skipped: list[int] = []
    for t, tin, tout in iter_trace(path, on_bad_row=on_bad_row, skipped=skipped):
        n += 1
        s_in += tin
        s_out += tout
        last = t
    if n == 0:
        raise TraceError(f"{path}: no requests")
    return TraceStats(n, last, s_in / n, max(s_out / n, 1.0), len(skipped))
