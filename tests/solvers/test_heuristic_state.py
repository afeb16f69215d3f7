"""The heuristics' plan state: a model's own capacity and unmet demand equal the whole-plan figures."""

from __future__ import annotations

import numpy as np

from solvers.allocation.columns import _columns
from solvers.allocation.heuristics import _State
from tests.solvers.alloc_instances import generate


def test_one_models_capacity_and_unmet_equal_the_whole_plans_exactly() -> None:
    c = _columns(generate("core", 30, seed=3, disagg_fraction=0.5))
    assert c.Q > 0, "the instance has prefill/decode pools"
    rng = np.random.default_rng(7)
    for _ in range(20):
        s = _State(c, rng.integers(0, 3, size=c.J) * (rng.random(c.J) < 0.05))
        capacity, unmet = s.capacity(), s.unmet()
        assert [s.model_capacity(m) for m in range(c.M)] == capacity.tolist()  # bit for bit: same sums, same order
        some = np.sort(rng.choice(c.M, size=max(1, c.M // 2), replace=False))
        assert s.unmet_of(some)[some].tolist() == unmet[some].tolist()
        assert not np.delete(s.unmet_of(some), some).any()
        assert s.unmet_of(np.arange(c.M)).tolist() == unmet.tolist()
