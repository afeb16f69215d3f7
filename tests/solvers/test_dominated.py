"""`solvers.reduce.dominated` against its definition, written as a loop over every pair of options."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.reduce import dominated


def by_definition(k: np.ndarray, cap: np.ndarray, lat: np.ndarray, d: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """x is dominated when some y with the same k has capacity >= and latencies <= in every metric, may run
    wherever x may (d >= and ends a superset), and is strictly better somewhere or, equal, has a lower index."""
    n = k.size
    out = np.zeros(n, dtype=bool)
    for x in range(n):
        for y in range(n):
            if x == y or k[x] != k[y]:
                continue
            weak = cap[y] >= cap[x] and bool(np.all(lat[:, y] <= lat[:, x]))
            role = d[y] >= d[x] and (ends[y] & ends[x]) == ends[x]
            strict = cap[y] > cap[x] or bool(np.any(lat[:, y] < lat[:, x])) or d[y] > d[x] or ends[y] != ends[x]
            if weak and role and (strict or y < x):
                out[x] = True
    return out


@pytest.mark.parametrize("seed", range(40))
def test_dominated_equals_its_definition(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 30))
    metrics = int(rng.integers(1, 3))
    # few distinct values, so that groups, ties and equal options are common
    k = rng.integers(1, 5, n)
    cap = rng.integers(0, 4, n).astype(np.float64)
    lat = rng.integers(0, 3, (metrics, n)).astype(np.float64)
    d = rng.integers(1, 3, n)
    ends = rng.integers(0, 4, n)
    assert np.array_equal(dominated(k, cap, lat, d, ends), by_definition(k, cap, lat, d, ends))
    zero = np.zeros(n, np.int64)
    assert np.array_equal(dominated(k, cap, lat), by_definition(k, cap, lat, zero, zero))


def test_equal_options_keep_the_first_and_distinct_k_never_compete() -> None:
    k = np.array([2, 2, 2, 3])
    cap = np.array([1.0, 1.0, 5.0, 9.0])
    lat = np.array([[1.0, 1.0, 0.5, 0.1]])
    # option 2 beats 0 and 1; option 3 has another k, so it dominates nobody
    assert dominated(k, cap, lat).tolist() == [True, True, False, False]
    assert dominated(k[:2], cap[:2], lat[:, :2]).tolist() == [False, True]
