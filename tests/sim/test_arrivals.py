"""Arrival generators and trace replay: rates, burstiness, lengths, determinism, streaming."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from coral.sim import (
    ArrivalError,
    BurstyArrivals,
    DiurnalArrivals,
    LengthDist,
    PoissonArrivals,
    ShareSplitter,
    TraceArrivals,
    TraceLengths,
)
from tests.conftest import shared_path


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_poisson_rate_steps_and_determinism() -> None:
    lengths = LengthDist(100, 50, "fixed")
    arr = list(PoissonArrivals([(0.0, 10.0), (500.0, 0.0), (700.0, 40.0)], lengths, rng(1), end_s=1000.0))
    t = np.array([a[0] for a in arr])
    assert np.all(np.diff(t) >= 0) and t[-1] < 1000.0
    assert ((t < 500).sum()) == pytest.approx(5000, rel=0.05)
    assert ((t >= 500) & (t < 700)).sum() == 0
    assert (t >= 700).sum() == pytest.approx(12000, rel=0.05)
    assert {(a[1], a[2]) for a in arr} == {(100, 50)}
    again = list(PoissonArrivals([(0.0, 10.0), (500.0, 0.0), (700.0, 40.0)], lengths, rng(1), end_s=1000.0))
    assert arr == again


def test_bursty_has_the_requested_cv() -> None:
    arr = list(BurstyArrivals(20.0, 3.0, LengthDist(10, 10, "fixed"), rng(2), end_s=5000.0))
    gaps = np.diff([a[0] for a in arr])
    assert len(arr) == pytest.approx(100_000, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.08)


def test_diurnal_follows_its_rate() -> None:
    src = DiurnalArrivals(10.0, LengthDist(10, 10, "fixed"), rng(3), end_s=1000.0, amplitude=0.8, period_s=1000.0)
    t = np.array([a[0] for a in src])
    assert len(t) == pytest.approx(10_000, rel=0.05)
    first, second = (t < 500).sum(), (t >= 500).sum()  # the sine is positive on the first half
    assert first / second == pytest.approx((1 + 0.8 * 2 / np.pi) / (1 - 0.8 * 2 / np.pi), rel=0.1)
    assert src.rate_at(250.0) == pytest.approx(18.0)


@pytest.mark.parametrize("dist", ["fixed", "exponential", "lognormal"])
def test_length_dist_means_and_bounds(dist: str) -> None:
    ins, outs = LengthDist(1000, 200, dist, cv_in=0.5, cv_out=1.0).sample(rng(4), 100_000)
    assert ins.min() >= 1 and outs.min() >= 1
    assert ins.max() <= 10_000 and outs.max() <= 2000
    assert ins.mean() == pytest.approx(1000, rel=0.03)
    assert outs.mean() == pytest.approx(200, rel=0.03)


def test_bad_generator_parameters() -> None:
    with pytest.raises(ArrivalError, match="length dist must be one of"):
        LengthDist(10, 10, "pareto")
    with pytest.raises(ArrivalError, match="cv must be positive"):
        BurstyArrivals(1.0, 0.0, LengthDist(10, 10), rng(), end_s=10)
    with pytest.raises(ArrivalError, match="rate series times must be increasing"):
        PoissonArrivals([(5.0, 1.0), (1.0, 2.0)], LengthDist(10, 10), rng(), end_s=10)
    with pytest.raises(ArrivalError, match="not negative"):
        PoissonArrivals(-1.0, LengthDist(10, 10), rng(), end_s=10)


def _trace(tmp_path: Path, n: int, gap: float = 1.0) -> Path:
    p = tmp_path / "t.csv"
    t0 = datetime(2023, 11, 16, 18, 0, 0)
    rows = [f"{t0 + timedelta(seconds=i * gap):%Y-%m-%d %H:%M:%S.%f},{100 + i},{10 + i % 7}" for i in range(n)]
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return p


@pytest.mark.parametrize("k", [0.5, 1.0, 2.0, 3.5])
def test_trace_scaling_keeps_time_axis_and_scales_count(tmp_path: Path, k: float) -> None:
    p = _trace(tmp_path, 2001)
    src = TraceArrivals(p, rng(5), end_s=2000.0, rate_scale=k)
    arr = list(src)
    t = np.array([a[0] for a in arr])
    assert np.all(np.diff(t) >= 0) and t[-1] < 2000.0
    assert len(arr) == pytest.approx(k * 2000, rel=0.05 if k != int(k) else 1e-9)
    assert src.rate_at(30.0) == pytest.approx(k)
    assert {a[1] for a in arr} <= set(range(100, 2101))


def test_trace_loops_when_the_run_outlasts_it(tmp_path: Path) -> None:
    p = _trace(tmp_path, 100)
    arr = list(TraceArrivals(p, rng(6), end_s=350.0))
    t = np.array([a[0] for a in arr])
    assert len(arr) == 350
    assert np.all(np.diff(t) > 0)


def test_share_splitter_follows_demand_shares(tmp_path: Path) -> None:
    src = PoissonArrivals(100.0, LengthDist(10, 10, "fixed"), rng(7), end_s=200.0)
    split = ShareSplitter(src, [[(0.0, 1.0), (100.0, 3.0)], [(0.0, 1.0)]], rng(8))
    arr = list(split)
    early = np.array([a[1] for a in arr if a[0] < 100])
    late = np.array([a[1] for a in arr if a[0] >= 100])
    assert (early == 0).mean() == pytest.approx(0.5, abs=0.03)
    assert (late == 0).mean() == pytest.approx(0.75, abs=0.03)
    assert split.rate_at(0, 150.0) == pytest.approx(75.0)


def test_trace_lengths_reservoir_is_bounded_and_seeded(tmp_path: Path) -> None:
    p = _trace(tmp_path, 500)
    a = TraceLengths(p, seed=1, max_rows=64)
    b = TraceLengths(p, seed=1, max_rows=64)
    assert len(a.ins) == 64
    assert np.array_equal(a.ins, b.ins)
    ins, _ = a.sample(rng(), 1000)
    assert set(ins.tolist()) <= set(range(100, 600))


def test_azure_conversation_trace_streams_at_scale() -> None:
    path = shared_path("traces", "azure-llm-2023-conv.csv")
    src = TraceArrivals(path, rng(9), end_s=600.0, rate_scale=10.0)
    n_rows = sum(1 for _ in itertools.takewhile(lambda r: r[0] < 600.0, _rows(path)))
    arr = list(src)
    assert len(arr) == pytest.approx(10 * n_rows, rel=0.01)
    mean_in = np.mean([a[1] for a in arr])
    assert 800 < mean_in < 1500


def _rows(path: Path):  # type: ignore[no-untyped-def]
    from coral.traces import iter_trace

    return iter_trace(path)
