"""Profile tables measured on real hardware, in the per-layer format Helix uses.

A profile table gives, for one (model, GPU type, TP degree), the time of ONE layer:

- ``prefill``: against the number of prompt tokens in the batch (x = tokens);
- ``decode``: against the batch size (x = sequences), at the table's context length.

CSV columns: ``model,gpu,tp,phase,x,layer_s,context``. Rows of one (model, gpu, tp) form a table; x must
increase within a phase. Between points the time is interpolated linearly; beyond the last point it is
extrapolated along the last segment, and below the first point it is the first point's time.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

from coral.errors import CoralError

COLUMNS = ("model", "gpu", "tp", "phase", "x", "layer_s", "context")


class ProfileError(CoralError):
    """A profile file is malformed; the message names the file, line and field."""


@attrs.frozen(eq=False)
class ProfileTable:
    """Per-layer timings of one model on one GPU type at one TP degree."""

    model: str
    gpu: str
    tp: int
    context: int
    prefill_x: NDArray[np.float64]
    prefill_s: NDArray[np.float64]
    decode_x: NDArray[np.float64]
    decode_s: NDArray[np.float64]
    source: str

    def prefill_layer_s(self, tokens: ArrayLike) -> NDArray[np.float64]:
        return _interp(np.asarray(tokens, dtype=np.float64), self.prefill_x, self.prefill_s)

    def decode_layer_s(self, batch: ArrayLike) -> NDArray[np.float64]:
        return _interp(np.asarray(batch, dtype=np.float64), self.decode_x, self.decode_s)

    def digest(self) -> str:
        parts = [self.model, self.gpu, str(self.tp), str(self.context)]
        for arr in (self.prefill_x, self.prefill_s, self.decode_x, self.decode_s):
            parts.append(",".join(repr(float(v)) for v in arr))
        return "|".join(parts)


def _interp(x: NDArray[np.float64], xp: NDArray[np.float64], fp: NDArray[np.float64]) -> NDArray[np.float64]:
    y = np.interp(x, xp, fp)
    if len(xp) >= 2:
        slope = (fp[-1] - fp[-2]) / (xp[-1] - xp[-2])
        y = np.where(x > xp[-1], fp[-1] + slope * (x - xp[-1]), y)
    out: NDArray[np.float64] = y
    return out


def load_profiles(path: Path) -> list[ProfileTable]:
    """Read a profile CSV; raise ProfileError naming the file, line and field on bad input."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ProfileError(f"{path}: cannot read profile: {e.strerror}") from e
    reader = csv.DictReader(text.splitlines())
    if reader.fieldnames is None or tuple(reader.fieldnames) != COLUMNS:
        raise ProfileError(f"{path}:1: header must be {','.join(COLUMNS)}, got {reader.fieldnames}")
    groups: dict[tuple[str, str, int], dict[str, list[tuple[float, float]]]] = {}
    contexts: dict[tuple[str, str, int], int] = {}
    for lineno, row in enumerate(reader, start=2):
        key, phase, x, t, ctx = _parse_row(path, lineno, row)
        if key in contexts and contexts[key] != ctx:
            raise ProfileError(f"{path}:{lineno}: field 'context': {ctx} differs from {contexts[key]} for {key}")
        contexts[key] = ctx
        pts = groups.setdefault(key, {"prefill": [], "decode": []})[phase]
        if pts and x <= pts[-1][0]:
            raise ProfileError(f"{path}:{lineno}: field 'x': {x} does not increase within {key} {phase}")
        pts.append((x, t))
    tables = []
    for key, phases in groups.items():
        for phase in ("prefill", "decode"):
            if not phases[phase]:
                raise ProfileError(f"{path}: table {key} has no {phase} rows")
        pre, dec = np.array(phases["prefill"]), np.array(phases["decode"])
        tables.append(
            ProfileTable(key[0], key[1], key[2], contexts[key], pre[:, 0], pre[:, 1], dec[:, 0], dec[:, 1], str(path))
        )
    if not tables:
        raise ProfileError(f"{path}: no rows")
    return tables


def _parse_row(path: Path, lineno: int, row: dict[str, str]) -> tuple[tuple[str, str, int], str, float, float, int]:
    def num(field: str, kind: type) -> float:
        raw = row.get(field)
        try:
            v = kind(raw)
        except (TypeError, ValueError):
            raise ProfileError(f"{path}:{lineno}: field '{field}': not a number: {raw!r}") from None
        if not np.isfinite(v) or v <= 0:
            raise ProfileError(f"{path}:{lineno}: field '{field}': must be positive, got {raw!r}")
        return float(v)

    phase = row.get("phase", "")
    if phase not in ("prefill", "decode"):
        raise ProfileError(f"{path}:{lineno}: field 'phase': must be prefill or decode, got {phase!r}")
    for field in ("model", "gpu"):
        if not row.get(field):
            raise ProfileError(f"{path}:{lineno}: field '{field}': empty")
    tp = int(num("tp", int))
    return (row["model"], row["gpu"], tp), phase, num("x", float), num("layer_s", float), int(num("context", int))


def index_profiles(tables: Iterable[ProfileTable]) -> dict[tuple[str, str, int], ProfileTable]:
    """Key tables by (model, gpu, tp); a duplicate key is an error."""
    out: dict[tuple[str, str, int], ProfileTable] = {}
    for t in tables:
        key = (t.model, t.gpu, t.tp)
        if key in out:
            raise ProfileError(f"{t.source}: duplicate profile table for {key} (also in {out[key].source})")
        out[key] = t
    return out
