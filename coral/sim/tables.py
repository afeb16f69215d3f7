"""Per-stage timing tables: the perf model tabulated once, then read by interpolation in the hot loop.

A stage (model, node type, TP, layers) gets ``decode[b][j]`` = decode step seconds for batch ``b`` at
context ``grid[j]`` and ``prefill[n][j]`` = seconds of ``n`` prompts of ``grid[j]`` tokens each. The
context grid is geometric (ratio 1.1, 1 to ~4M tokens), and reads interpolate linearly in the context
between the two neighbouring grid points, which is exact at the grid points and within a fraction of a
percent between them for the roofline (piecewise linear in the context). Batches of more than the
table's largest prompt count are read as that many prompts sharing the tokens.
"""

from __future__ import annotations

import math

import numpy as np

from coral.perf import PerfModel

RATIO = 1.1
GRID_N = 162
PREFILL_N = 32
_LOG_R = math.log(RATIO)
GRID = [RATIO**j for j in range(GRID_N)]


class StageTable:
    """Decode and prefill times of one stage shape, for batches up to ``max_batch``."""

    __slots__ = ("decode_rows", "max_batch", "prefill_rows")

    def __init__(self, perf: PerfModel, model: str, node: str, tp: int, layers: int, max_batch: int) -> None:
        self.max_batch = max_batch
        g = np.asarray(GRID)
        b = np.arange(1, max_batch + 1, dtype=np.float64)
        dec = perf.decode_step_s(model, node, layers=layers, batch=b[:, None], context=g[None, :], tp=tp)
        n = np.arange(1, PREFILL_N + 1, dtype=np.float64)
        pre = perf.prefill_s(model, node, layers=layers, batch=n[:, None], prompt=g[None, :], tp=tp)
        dec = np.broadcast_to(dec, (max_batch, GRID_N))
        pre = np.broadcast_to(pre, (PREFILL_N, GRID_N))
        self.decode_rows: list[list[float]] = [[0.0] * GRID_N, *np.asarray(dec, dtype=float).tolist()]
        self.prefill_rows: list[list[float]] = [[0.0] * GRID_N, *np.asarray(pre, dtype=float).tolist()]

    def decode(self, batch: int, context: float) -> float:
        """Seconds of one decode step of ``batch`` sequences at mean context ``context``."""
        return _interp(self.decode_rows[batch if batch <= self.max_batch else self.max_batch], context)

    def prefill(self, prompts: int, tokens: int) -> float:
        """Seconds to prefill ``tokens`` tokens split evenly over ``prompts`` prompts."""
        n = prompts if prompts <= PREFILL_N else PREFILL_N
        return _interp(self.prefill_rows[n], tokens / n)

    def time(self, n_dec: int, ctx: float, n_pre: int, pre_tokens: int) -> float:
        """One iteration: the decode step of ``n_dec`` sequences plus the prefill chunks, time-shared."""
        t = 0.0
        if n_dec:
            t = _interp(self.decode_rows[n_dec if n_dec <= self.max_batch else self.max_batch], ctx)
        if n_pre:
            n = n_pre if n_pre <= PREFILL_N else PREFILL_N
            t += _interp(self.prefill_rows[n], pre_tokens / n)
        return t


def _interp(row: list[float], x: float) -> float:
    if x <= 1.0:
        return row[0]
    j = int(math.log(x) / _LOG_R)
    if j >= GRID_N - 1:
        j = GRID_N - 2
    x0 = GRID[j]
    if x < x0:
        j -= 1
        x0 = GRID[j]
    elif x >= GRID[j + 1] and j < GRID_N - 2:
        j += 1
        x0 = GRID[j]
    y0 = row[j]
    return y0 + (row[j + 1] - y0) * (x - x0) / (GRID[j + 1] - x0)
