"""Request arrivals for the fleet simulator: trace replay and seeded generators.

Every source is an iterable of ``(time_s, prompt_tokens, output_tokens)`` in non-decreasing time, ending
before ``end_s``, and reports its nominal rate (``rate_at``) for the planner. Randomness comes from a
``numpy.random.Generator`` drawn in blocks, so the same seed gives the same stream and the per-arrival
cost stays small. Nothing holds a whole trace: trace replay streams rows, and trace-based length
sampling keeps a bounded reservoir.

- :class:`PoissonArrivals`: Poisson with a step rate series (``[(t, rps), ...]`` or a constant).
- :class:`BurstyArrivals`: a renewal process with gamma inter-arrival times of a given CV (CV 1 is
  Poisson; larger is burstier), under the same step rate series (time change by the integrated rate).
- :class:`DiurnalArrivals`: Poisson with rate ``mean * (1 + amplitude * sin(2 pi (t - phase) / period))``
  (by thinning).
- :class:`TraceArrivals`: replays an Azure-format trace with its time axis kept and its rate scaled by
  ``rate_scale``: each row becomes ``floor(k)`` or ``ceil(k)`` arrivals (Bernoulli on the fraction),
  spread uniformly over the gap to the next row; the copies beyond the first take their lengths from a
  ring of recent rows, so the length mix follows the trace locally. The trace loops when the
  simulation outlasts it.
- :class:`ShareSplitter`: tags each arrival of one source with a deployment, drawn by demand share.
- :func:`deployment_arrivals`: every deployment's own source, seeded per deployment: the mesh's traffic
  (``actors.feed.Traffic``); given to the simulator (``simulate(arrivals=...)``), it runs on the same
  requests as a mesh run of the same seed.

Lengths: :class:`LengthDist` (``fixed``, ``exponential`` or ``lognormal`` around given means, clipped at
``clip`` times the mean) or :class:`TraceLengths` (a seeded reservoir sample of a trace's rows).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

import attrs
import numpy as np
from numpy.typing import NDArray

from coral.errors import CoralError
from coral.scenario import Scenario
from coral.traces import iter_trace

BLOCK = 4096
I64 = NDArray[np.int64]
LENGTH_DISTS = ("fixed", "exponential", "lognormal")


class ArrivalError(CoralError):
    """An arrival generator was given an impossible parameter."""


class LengthSampler(Protocol):
    """Draws ``n`` (prompt, output) token counts."""

    def sample(self, rng: np.random.Generator, n: int) -> tuple[I64, I64]: ...


class ArrivalSource(Protocol):
    """An iterable of (time s, prompt tokens, output tokens) with a nominal rate for the planner."""

    def __iter__(self) -> Iterator[tuple[float, int, int]]: ...

    def rate_at(self, t: float) -> float: ...


@attrs.frozen
class LengthDist:
    """Lengths around given means: ``fixed``, ``exponential`` or ``lognormal`` with coefficients of
    variation ``cv_in``/``cv_out``; draws are rounded, at least 1 and at most ``clip`` times the mean."""

    mean_in: float
    mean_out: float
    dist: str = "lognormal"
    cv_in: float = 0.6
    cv_out: float = 1.2
    clip: float = 10.0

    def __attrs_post_init__(self) -> None:
        if self.dist not in LENGTH_DISTS:
            raise ArrivalError(f"length dist must be one of {', '.join(LENGTH_DISTS)}, got {self.dist!r}")
        for name in ("mean_in", "mean_out", "clip"):
            if not getattr(self, name) >= 1:
                raise ArrivalError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("cv_in", "cv_out"):
            if not getattr(self, name) >= 0:
                raise ArrivalError(f"{name} must not be negative, got {getattr(self, name)}")

    def _one(self, rng: np.random.Generator, mean: float, cv: float, n: int) -> I64:
        if self.dist == "fixed" or cv == 0:
            x = np.full(n, mean)
        elif self.dist == "exponential":
            x = rng.exponential(mean, n)
        else:
            s2 = math.log1p(cv * cv)
            x = rng.lognormal(math.log(mean) - s2 / 2, math.sqrt(s2), n)
        return np.clip(np.rint(x), 1, max(1.0, math.floor(mean * self.clip))).astype(np.int64)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[I64, I64]:
        return self._one(rng, self.mean_in, self.cv_in, n), self._one(rng, self.mean_out, self.cv_out, n)


class TraceLengths:
    """Lengths drawn from a seeded reservoir sample (at most ``max_rows`` rows) of a trace."""

    def __init__(self, path: Path, *, seed: int = 0, max_rows: int = 65536, on_bad_row: str = "stop") -> None:
        rng = np.random.default_rng(seed)
        ins = np.zeros(max_rows, dtype=np.int64)
        outs = np.zeros(max_rows, dtype=np.int64)
        n = 0
        for _, tin, tout in iter_trace(path, on_bad_row=on_bad_row):
            if n < max_rows:
                ins[n], outs[n] = tin, tout
            else:
                j = int(rng.integers(0, n + 1))
                if j < max_rows:
                    ins[j], outs[j] = tin, tout
            n += 1
        if n == 0:
            raise ArrivalError(f"{path}: trace has no requests to sample lengths from")
        k = min(n, max_rows)
        self.ins = np.maximum(ins[:k], 1)
        self.outs = np.maximum(outs[:k], 1)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[I64, I64]:
        idx = rng.integers(0, len(self.ins), n)
        return self.ins[idx], self.outs[idx]


def _series(rate: float | Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    if isinstance(rate, int | float):
        pts: Sequence[tuple[float, float]] = ((0.0, float(rate)),)
    else:
        pts = rate
    if not pts:
        raise ArrivalError("rate series must not be empty")
    times = [float(p[0]) for p in pts]
    rates = [float(p[1]) for p in pts]
    if times != sorted(times):
        raise ArrivalError("rate series times must be increasing")
    for r in rates:
        if not (r >= 0 and math.isfinite(r)):
            raise ArrivalError(f"rates must be finite and not negative, got {r}")
    times[0] = min(times[0], 0.0)
    return times, rates


def _step_at(times: list[float], rates: list[float], t: float) -> float:
    i = 0
    for j, s in enumerate(times):
        if s <= t:
            i = j
    return rates[i]


class _Renewal:
    """A renewal process with unit-mean gaps mapped through a step rate series (time change)."""

    def __init__(
        self,
        rate: float | Sequence[tuple[float, float]],
        lengths: LengthSampler,
        rng: np.random.Generator,
        end_s: float,
        cv: float,
    ) -> None:
        if not cv > 0:
            raise ArrivalError(f"cv must be positive, got {cv}")
        if not end_s > 0:
            raise ArrivalError(f"end_s must be positive, got {end_s}")
        self.times, self.rates = _series(rate)
        self.lengths = lengths
        self.rng = rng
        self.end_s = float(end_s)
        self.cv = float(cv)

    def rate_at(self, t: float) -> float:
        return _step_at(self.times, self.rates, t)

    def _gaps(self, n: int) -> NDArray[np.float64]:
        if self.cv == 1.0:
            return self.rng.exponential(1.0, n)
        k = 1.0 / (self.cv * self.cv)
        return self.rng.gamma(k, 1.0 / k, n)

    def __iter__(self) -> Iterator[tuple[float, int, int]]:
        times, rates, end = self.times, self.rates, self.end_s
        seg, nseg = 0, len(times)
        t = 0.0
        while True:
            gaps = self._gaps(BLOCK).tolist()
            ins, outs = self.lengths.sample(self.rng, BLOCK)
            li, lo = ins.tolist(), outs.tolist()
            for i in range(BLOCK):
                e = gaps[i]
                while True:
                    nxt = times[seg + 1] if seg + 1 < nseg else math.inf
                    r = rates[seg]
                    if r > 0 and t + e / r < nxt:
                        t += e / r
                        break
                    if nxt == math.inf:
                        return
                    e -= r * (nxt - t)
                    t = nxt
                    seg += 1
                if t >= end:
                    return
                yield t, li[i], lo[i]


class PoissonArrivals(_Renewal):
    """Poisson arrivals at ``rate`` (req/s, or a step series of (t, rps)) until ``end_s``."""

    def __init__(
        self,
        rate: float | Sequence[tuple[float, float]],
        lengths: LengthSampler,
        rng: np.random.Generator,
        *,
        end_s: float,
    ) -> None:
        super().__init__(rate, lengths, rng, end_s, 1.0)


class BurstyArrivals(_Renewal):
    """Gamma inter-arrival times with coefficient of variation ``cv`` at ``rate`` until ``end_s``."""

    def __init__(
        self,
        rate: float | Sequence[tuple[float, float]],
        cv: float,
        lengths: LengthSampler,
        rng: np.random.Generator,
        *,
        end_s: float,
    ) -> None:
        super().__init__(rate, lengths, rng, end_s, cv)


class DiurnalArrivals:
    """Poisson arrivals at ``mean_rps * (1 + amplitude * sin(2 pi (t - phase_s) / period_s))``."""

    def __init__(
        self,
        mean_rps: float,
        lengths: LengthSampler,
        rng: np.random.Generator,
        *,
        end_s: float,
        amplitude: float = 0.5,
        period_s: float = 86400.0,
        phase_s: float = 0.0,
    ) -> None:
        if not mean_rps > 0:
            raise ArrivalError(f"mean_rps must be positive, got {mean_rps}")
        if not 0 <= amplitude <= 1:
            raise ArrivalError(f"amplitude must be in [0, 1], got {amplitude}")
        if not period_s > 0:
            raise ArrivalError(f"period_s must be positive, got {period_s}")
        self.mean, self.amp, self.period, self.phase = float(mean_rps), float(amplitude), float(period_s), phase_s
        self.lengths, self.rng, self.end_s = lengths, rng, float(end_s)

    def rate_at(self, t: float) -> float:
        return self.mean * (1.0 + self.amp * math.sin(2.0 * math.pi * (t - self.phase) / self.period))

    def __iter__(self) -> Iterator[tuple[float, int, int]]:
        peak = self.mean * (1.0 + self.amp)
        t = 0.0
        while True:
            gaps = self.rng.exponential(1.0 / peak, BLOCK).tolist()
            keep = self.rng.random(BLOCK).tolist()
            ins, outs = self.lengths.sample(self.rng, BLOCK)
            li, lo = ins.tolist(), outs.tolist()
            for i in range(BLOCK):
                t += gaps[i]
                if t >= self.end_s:
                    return
                if keep[i] * peak <= self.rate_at(t):
                    yield t, li[i], lo[i]


class TraceArrivals:
    """Streams an Azure-format trace with its rate scaled by ``rate_scale`` (see the module docstring).

    ``rate_at`` is the scaled arrival rate of the trace in the ``bucket_s`` window holding ``t``, from one
    streaming pre-pass (which also validates every row, so a bad row stops the run before it starts).
    Output token counts of 0 become 1 (a request yields at least one token).
    """

    def __init__(
        self,
        path: Path,
        rng: np.random.Generator,
        *,
        end_s: float,
        rate_scale: float = 1.0,
        on_bad_row: str = "stop",
        ring: int = 1024,
        bucket_s: float = 60.0,
    ) -> None:
        if not rate_scale > 0:
            raise ArrivalError(f"rate_scale must be positive, got {rate_scale}")
        if not end_s > 0:
            raise ArrivalError(f"end_s must be positive, got {end_s}")
        self.path, self.rng, self.end_s = Path(path), rng, float(end_s)
        self.k, self.on_bad_row, self.ring, self.bucket_s = float(rate_scale), on_bad_row, ring, bucket_s
        self.skipped: list[int] = []
        counts: list[int] = []
        n, last = 0, 0.0
        for t, _, _ in iter_trace(self.path, on_bad_row=on_bad_row, skipped=self.skipped):
            b = int(t // bucket_s)
            if b >= len(counts):
                counts.extend([0] * (b + 1 - len(counts)))
            counts[b] += 1
            n += 1
            last = t
        if n == 0:
            raise ArrivalError(f"{self.path}: trace has no requests")
        self.rows = n
        self.mean_gap = last / (n - 1) if n > 1 and last > 0 else 1.0
        self.period = last + self.mean_gap
        self.bucket_rates = [c * self.k / bucket_s for c in counts]
        self.mean_rate = n * self.k / self.period

    def rate_at(self, t: float) -> float:
        b = int((t % self.period) // self.bucket_s)
        return self.bucket_rates[b] if b < len(self.bucket_rates) else self.mean_rate

    def _rows(self) -> Iterator[tuple[float, int, int]]:
        offset = 0.0
        while True:
            for t, tin, tout in iter_trace(self.path, on_bad_row=self.on_bad_row):
                yield t + offset, max(tin, 1), max(tout, 1)
            offset += self.period

    def __iter__(self) -> Iterator[tuple[float, int, int]]:
        k, end, rng = self.k, self.end_s, self.rng
        whole, frac = math.floor(k), k - math.floor(k)
        ring_in = [0] * self.ring
        ring_out = [0] * self.ring
        filled = 0
        pos = 0
        u = rng.random(BLOCK).tolist()
        ui = 0
        prev: tuple[float, int, int] | None = None
        for row in self._rows():
            ring_in[pos], ring_out[pos] = row[1], row[2]
            pos = (pos + 1) % self.ring
            filled = min(filled + 1, self.ring)
            if prev is not None:
                t0 = prev[0]
                gap = row[0] - t0
                if ui + 3 * (whole + 2) >= BLOCK:
                    u = rng.random(BLOCK).tolist()
                    ui = 0
                m = whole + (1 if u[ui] < frac else 0)
                ui += 1
                if m:
                    offs = sorted(u[ui : ui + m])
                    ui += m
                    for j in range(m):
                        t = t0 + offs[j] * gap
                        if t >= end:
                            return
                        if j == 0:
                            yield t, prev[1], prev[2]
                        else:
                            r = int(u[ui] * filled)
                            ui += 1
                            yield t, ring_in[r], ring_out[r]
                if row[0] >= end:
                    return
            prev = row


class ShareSplitter:
    """Tags each arrival of ``source`` with a deployment index drawn by demand share.

    ``shares[i]`` is deployment i's demand as a step series of (t, weight); the weights are normalised
    at each moment (equal shares where all are zero).
    """

    def __init__(
        self, source: ArrivalSource, shares: Sequence[Sequence[tuple[float, float]]], rng: np.random.Generator
    ) -> None:
        if not shares:
            raise ArrivalError("ShareSplitter needs at least one share")
        self.source, self.rng = source, rng
        self.series = [_series(s) for s in shares]
        self.changes = sorted({t for times, _ in self.series for t in times if t > 0})

    def weights(self, t: float) -> list[float]:
        w = [_step_at(times, rates, t) for times, rates in self.series]
        tot = sum(w)
        return [x / tot for x in w] if tot > 0 else [1.0 / len(w)] * len(w)

    def rate_at(self, i: int, t: float) -> float:
        return self.source.rate_at(t) * self.weights(t)[i]

    def __iter__(self) -> Iterator[tuple[float, int, int, int]]:
        u = self.rng.random(BLOCK).tolist()
        ui = 0
        n = len(self.series)
        changes = [*self.changes, math.inf]
        ci = 0
        cum = np.cumsum(self.weights(0.0)).tolist()
        for t, tin, tout in self.source:
            if t >= changes[ci]:
                while t >= changes[ci]:
                    ci += 1
                cum = np.cumsum(self.weights(t)).tolist()
            if ui >= BLOCK:
                u = self.rng.random(BLOCK).tolist()
                ui = 0
            x = u[ui]
            ui += 1
            i = 0
            while i < n - 1 and x >= cum[i]:
                i += 1
            yield t, i, tin, tout


def deployment_arrivals(
    scenario: Scenario, *, seed: int, end_s: float, length_dist: str, cv_in: float, cv_out: float
) -> dict[str, ArrivalSource]:
    """Per deployment, in the scenario's order: Poisson arrivals over its demand series with ``length_dist``
    lengths around its shape (CVs ``cv_in``, ``cv_out``), or its trace; deployment i draws from child i of
    ``SeedSequence(seed)``."""
    kids = np.random.SeedSequence(seed).spawn(len(scenario.deployments))
    out: dict[str, ArrivalSource] = {}
    for i, d in enumerate(scenario.deployments):
        rng = np.random.default_rng(kids[i])
        if d.demand.trace is not None:
            out[d.name] = TraceArrivals(d.demand.trace, rng, end_s=end_s, rate_scale=d.demand.scale)
        else:
            lengths = LengthDist(d.shape.mean_in, d.shape.mean_out, length_dist, cv_in, cv_out)
            out[d.name] = PoissonArrivals(list(d.demand.series), lengths, rng, end_s=end_s)
    return out
