"""Simulation results: per-deployment statistics, the summary, JSON, the per-interval CSV and a plot.

The interval series has one row per (interval, deployment): arrivals and completions per second, the
serving capacity (req/s at the deployment's shape) and the queue at the interval's end, the mean cost
rate over the interval (USD/h) and the fraction of requests finished in it that met both targets.

Latency percentiles come from log-spaced histograms (200 bins per decade from 10 us to 100 000 s, so a
percentile is within about 0.6% of the exact one) plus exact sums for the means, so memory does not grow
with the number of requests. Attainment fractions are over every arrival: a failed request misses both
targets. ``per_model`` is keyed by deployment name (the served model's name in the scenario).
"""

from __future__ import annotations

import bisect
import csv
import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

HIST_LO = -5.0
HIST_BPD = 200
HIST_BINS = 10 * HIST_BPD + 2

SERIES_FIELDS = (
    "t_start",
    "t_end",
    "model",
    "demand_rps",
    "capacity_rps",
    "served_rps",
    "failed",
    "queue",
    "instances",
    "cost_per_hour",
    "attainment_both",
)


class LogHist:
    """A fixed-size log-spaced histogram of positive durations, with exact count and sum."""

    __slots__ = ("_cum", "counts", "n", "total")

    def __init__(self) -> None:
        self.counts = [0] * HIST_BINS
        self.n = 0
        self.total = 0.0
        self._cum: tuple[int, list[int]] = (0, [])  # (n when computed, cumulative counts)

    def add(self, x: float) -> None:
        self.n += 1
        self.total += x
        if x <= 0:
            self.counts[0] += 1
            return
        i = int((math.log10(x) - HIST_LO) * HIST_BPD) + 1
        self.counts[0 if i < 0 else HIST_BINS - 1 if i >= HIST_BINS else i] += 1

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (geometric middle of its bin); 0.0 when empty."""
        if self.n == 0:
            return 0.0
        # the first bin whose cumulative count reaches q * n (counts are integers: at least 1), which is
        # never an empty bin; accumulate and bisect run in C (the router asks at every report)
        if self._cum[0] != self.n:  # counts change only with n (add, and merges that set both)
            self._cum = (self.n, list(itertools.accumulate(self.counts)))
        i = bisect.bisect_left(self._cum[1], max(q * self.n, 1))
        if i == 0:
            return 0.0
        return float(10 ** (HIST_LO + (min(i, HIST_BINS - 1) - 0.5) / HIST_BPD))

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0

    def figures(self) -> dict[str, float]:
        return {
            "p50": self.quantile(0.5),
            "p90": self.quantile(0.9),
            "p99": self.quantile(0.99),
            "mean": self.mean,
        }


class DepStats:
    """Running totals for one deployment (memory independent of the request count)."""

    __slots__ = (
        "completed",
        "cost",
        "e2e",
        "failed",
        "iv_arrivals",
        "iv_completed",
        "iv_failed",
        "iv_met",
        "met_both",
        "met_tpot",
        "met_ttft",
        "model",
        "name",
        "preemptions",
        "reasons",
        "requests",
        "retries",
        "tokens_in",
        "tokens_out",
        "tpot",
        "ttft",
    )

    def __init__(self, name: str, model: str) -> None:
        self.name, self.model = name, model
        self.requests = self.completed = self.failed = 0
        self.met_ttft = self.met_tpot = self.met_both = 0
        self.tokens_in = self.tokens_out = 0
        self.retries = self.preemptions = 0
        self.cost = 0.0
        self.reasons: dict[str, int] = {}
        self.ttft, self.tpot, self.e2e = LogHist(), LogHist(), LogHist()
        self.iv_arrivals = self.iv_completed = self.iv_failed = self.iv_met = 0

    def attainment(self) -> dict[str, float]:
        n = self.requests
        if n == 0:
            return {"ttft": 1.0, "tpot": 1.0, "both": 1.0}
        return {"ttft": self.met_ttft / n, "tpot": self.met_tpot / n, "both": self.met_both / n}

    def table(self, duration_s: float) -> dict[str, Any]:
        tokens = self.tokens_in + self.tokens_out
        return {
            "model": self.model,
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.failed,
            "failed_by_reason": dict(sorted(self.reasons.items())),
            "goodput_rps": self.met_both / duration_s,
            "attainment": self.attainment(),
            "latency": {"ttft": self.ttft.figures(), "tpot": self.tpot.figures(), "e2e": self.e2e.figures()},
            "cost": self.cost,
            "tokens": tokens,
            "cost_per_million_tokens": self.cost / tokens * 1e6 if tokens else 0.0,
            "retries": self.retries,
            "preemptions": self.preemptions,
        }


@attrs.frozen
class SimResult:
    """What one simulation produced: totals, per-deployment tables, the interval series and markers.

    ``stage_utilisation`` is each template stage's busy time over its serving time and ``kv_peak`` its
    highest KV-cache use as a fraction of capacity, keyed ``template_id/stage``. ``wall_s`` and
    ``replan_solve_s`` are wall-clock measurements and vary between runs; ``to_json`` leaves them out so
    that it is deterministic for a seed.
    """

    duration_s: float
    end_s: float
    stats: Mapping[str, DepStats]
    series: Sequence[tuple[Any, ...]]
    replans: int
    replan_solve_s: Sequence[float]
    plan_changes: Sequence[float]
    faults: Sequence[float]
    retries: int
    preemptions: int
    events: int
    wall_s: float
    skipped_rows: int = 0
    stage_utilisation: Mapping[str, float] = attrs.field(factory=dict)
    kv_peak: Mapping[str, float] = attrs.field(factory=dict)

    def _totals(self) -> DepStats:
        tot = DepStats("all", "all")
        for s in self.stats.values():
            for f in (
                "requests",
                "completed",
                "failed",
                "met_ttft",
                "met_tpot",
                "met_both",
                "tokens_in",
                "tokens_out",
                "retries",
                "preemptions",
            ):
                setattr(tot, f, getattr(tot, f) + getattr(s, f))
            tot.cost += s.cost
            for k, v in s.reasons.items():
                tot.reasons[k] = tot.reasons.get(k, 0) + v
            for h in ("ttft", "tpot", "e2e"):
                a, b = getattr(tot, h), getattr(s, h)
                a.n += b.n
                a.total += b.total
                a.counts = [x + y for x, y in zip(a.counts, b.counts, strict=True)]
        return tot

    def to_json(self) -> dict[str, Any]:
        """The stable machine-readable result: requests, completed, failed, goodput_rps, attainment, cost,
        per_model (each with the same fields but per_model)."""

        def brief(s: DepStats) -> dict[str, Any]:
            return {
                "requests": s.requests,
                "completed": s.completed,
                "failed": s.failed,
                "goodput_rps": s.met_both / self.duration_s,
                "attainment": s.attainment(),
                "cost": s.cost,
            }

        out = brief(self._totals())
        out["per_model"] = {name: brief(s) for name, s in self.stats.items()}
        return out

    def summary(self) -> dict[str, Any]:
        """Everything: totals, latency percentiles, cost per million tokens, replans, faults and tables."""
        tot = self._totals().table(self.duration_s)
        del tot["model"]
        tot.update(
            duration_s=self.duration_s,
            end_s=self.end_s,
            replans={
                "count": self.replans,
                "plan_changes": len(self.plan_changes),
                "solve_s_total": sum(self.replan_solve_s),
                "solve_s_max": max(self.replan_solve_s, default=0.0),
            },
            faults=len(self.faults),
            skipped_rows=self.skipped_rows,
            events=self.events,
            wall_s=self.wall_s,
            stage_utilisation=dict(self.stage_utilisation),
            kv_peak=dict(self.kv_peak),
            per_model={name: s.table(self.duration_s) for name, s in self.stats.items()},
        )
        return tot

    def write_csv(self, path: Path | str) -> None:
        """The per-interval series, one row per (interval, deployment)."""
        with Path(path).open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(SERIES_FIELDS)
            for row in self.series:
                w.writerow(["" if isinstance(v, float) and math.isnan(v) else v for v in row])

    def plot(self, path: Path | str) -> None:
        """Demand vs capacity per model, cost rate and SLO attainment over time, with plan changes (dotted)
        and faults (red) marked. Needs matplotlib (Agg backend)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
        names = list(self.stats)
        cost: dict[float, float] = {}
        for i, name in enumerate(names):
            rows = [r for r in self.series if r[2] == name]
            t = [r[1] for r in rows]
            color = f"C{i % 10}"
            axes[0].plot(t, [r[3] for r in rows], color=color, label=f"{name} demand")
            axes[0].plot(t, [r[4] for r in rows], color=color, linestyle="--", label=f"{name} capacity")
            axes[2].plot(t, [r[10] for r in rows], color=color, marker=".", label=name)
            for r in rows:
                cost[r[1]] = cost.get(r[1], 0.0) + r[9]
        ts = sorted(cost)
        axes[1].step(ts, [cost[x] for x in ts], where="pre", color="k")
        axes[0].set_ylabel("requests/s")
        axes[1].set_ylabel("cost (USD/h)")
        axes[2].set_ylabel("SLO attainment")
        axes[2].set_ylim(0, 1.05)
        axes[2].set_xlabel("time (s)")
        for ax in axes:
            for x in self.plan_changes:
                ax.axvline(x, color="grey", linestyle=":", linewidth=0.8)
            for x in self.faults:
                ax.axvline(x, color="red", linewidth=1.0)
        axes[0].legend(fontsize="small", ncol=2)
        axes[2].legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(str(path))
        plt.close(fig)
