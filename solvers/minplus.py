"""Min-plus convolution over layer counts: the knapsack step (least latency to cover q layers with
one more node) that the menu reductions and the chain family share."""

from __future__ import annotations

import numpy as np

_TOEPLITZ: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _toeplitz(L: int) -> tuple[np.ndarray, np.ndarray]:
    """Index q - p for q, p in 0..L, and the mask q >= p."""
    if L not in _TOEPLITZ:
        q = np.arange(L + 1)[:, None]
        p = np.arange(L + 1)[None, :]
        _TOEPLITZ[L] = (np.clip(q - p, 0, L), q >= p)
    return _TOEPLITZ[L]


def minplus(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """out[q] = min_p a[p] + b[q - p] over p <= q, and the minimising p (vectors of length L + 1)."""
    L = a.shape[0] - 1
    idx, ok = _toeplitz(L)
    cand = np.where(ok, a[None, :] + b[idx], np.inf)
    arg = np.argmin(cand, axis=1)
    return cand[np.arange(L + 1), arg], arg
