"""Min-plus convolution over layer counts: the knapsack step (least latency to cover q layers with
one more node) that the menu reductions and the chain family share."""

from __future__ import annotations

import numpy as np

_TOEPLITZ: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _toeplitz(L: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index q - p for q, p in 0..L, 0 where q >= p and inf elsewhere, and the rows 0..L."""
    if L not in _TOEPLITZ:
        q = np.arange(L + 1)[:, None]
        p = np.arange(L + 1)[None, :]
        _TOEPLITZ[L] = (np.clip(q - p, 0, L), np.where(q >= p, 0.0, np.inf), np.arange(L + 1))
    return _TOEPLITZ[L]


def minplus(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """out[q] = min_p a[p] + b[q - p] over p <= q, and the minimising p (vectors of length L + 1, no -inf)."""
    L = a.shape[0] - 1
    idx, off, rows = _toeplitz(L)
    cand = a[None, :] + b[idx]
    cand += off  # p > q: inf
    arg = np.argmin(cand, axis=1)
    return cand[rows, arg], arg
