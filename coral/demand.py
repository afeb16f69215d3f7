"""The demand estimate of a deployment from its arrival counts, and when a change of it is worth a re-plan.

Estimator (``DemandEstimator``), per deployment: the arrival rate over the last ``avg_s`` seconds (counts
over the covered time), held at its maximum over the last ``peak_s`` seconds, so that a burst is covered
at once and the estimate falls only after the burst has left the peak window. It starts from a prior
(the scenario's demand at time 0), entered as one observation of ``avg_s`` seconds at the prior rate.

``moved``: an estimate is worth publishing (and re-planning for) when some deployment's moved by a change
that is both large and real. Large: it rose by more than ``up`` (relative) or fell by more than ``down``
since the last published value, and by at least ``floor`` req/s either way (asymmetric, so that a fall is
not chased). Real: the arrivals are unlikely under the published rate r. Counts of a Poisson stream at
rate r over T seconds have mean rT and deviation sqrt(rT), so a change is real when (a) the estimate is
more than ``NOISE_Z`` deviations of a mean over ``avg_s`` away from r: |v - r| > Z sqrt(r / avg_s), or
(b) the counts N of some suffix of the recent reports (the last one, the last two, ... up to ``avg_s``),
over T seconds, lie more than Z deviations from rT on the side of the change (on Anscombe's scale,
2 sqrt(N + 3/8), whose deviation is 1 at any rate, so that the skewed tails of small counts do not pass
for changes). Without this test the peak-held mean of a constant stream crosses the relative thresholds
by noise alone: 16 re-plans an hour at a constant 2 req/s, 4 at 5 req/s (the flapping at t=952 and 962
of the default hour); with it, about 0.1 an hour at 0.5-12 req/s. (b) keeps a large step's detection as
fast as the relative test alone: the few seconds after the step in the last report already make it
real. A small step (2 -> 4 req/s) or a fall is seen up to a report or two later. (c) A small sustained
change (+20%) is neither: its counts drift from rT by about one deviation per minute. So the evidence is
also accumulated since the last publication, as a Poisson CUSUM (Page's test) against the published rate
r (``DemandEstimator.published``): per report of N arrivals over T seconds, the log-likelihood ratio of a
rate r1 against r, N ln(r1 / r) - (r1 - r) T, is added to a sum floored at 0; the change is real when the
sum passes ``CUSUM_H``. For a rise r1 = r (1 + 2 up), for a fall r1 = r (1 - 2 down) (at least r / 10):
the sum then grows, on average, exactly when the rate is beyond about r (1 + up) (r (1 - down)), the
change the relative thresholds call large, and shrinks otherwise. ``CUSUM_H`` is set by simulation
over seeded Poisson streams (reports every 5 s): a +20% step is published after a median 90 s at 5 req/s
and 230 s at 2 req/s (with (a) and (b) alone: 200 s and 600 s, a quarter of the steps at 2 req/s not in
20 min), with no more false alarms at a constant rate (0.05-0.15 an hour at 0.5-40 req/s, as before).

Backlog: requests that wait for an instance (the router's queue) are demand too. While ``w`` requests of a
deployment wait, its estimate is at least ``w / avg_s`` (the rate that serves them within the averaging
window), and ``moved`` takes no fall of it: without this the peak-held mean of a burst that stopped falls
to nothing while its requests still wait, and a re-plan drops the very instances that were loading for
them. A deployment published at zero while requests wait has moved, however few wait. A rise passes the
usual tests (a queue that grows by a few requests per report is not re-planned for at every report).

The mesh's demand monitor (``actors.demand``) and the simulator (``coral.sim``, ``SimConfig.monitor``)
both use it, so that they re-plan for the same estimates at the same moments.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence

from coral.messages.mesh import DemandTuning

NOISE_Z = 4.0
"""Poisson deviations beyond which a change of demand is taken as real (see the module docstring)."""
CUSUM_H = 10.0
"""The accumulated log-likelihood ratio beyond which a sustained change is taken as real (see the module
docstring)."""


class DemandEstimator:
    """Sliding-mean rates held at their peak (see the module docstring); pure and deterministic."""

    def __init__(
        self, deployments: Sequence[str], prior: Mapping[str, float], tuning: DemandTuning, start: float
    ) -> None:
        self.tuning = tuning.check()
        self.deployments = tuple(deployments)
        self.prior = {d: float(prior.get(d, 0.0)) for d in self.deployments}
        self.start = start
        self.windows: dict[str, deque[tuple[float, float, int]]] = {d: deque() for d in self.deployments}
        self.means: dict[str, deque[tuple[float, float]]] = {
            d: deque([(start, self.prior[d])]) for d in self.deployments
        }
        self.waiting: dict[str, int] = {}
        self.reference = dict(self.prior)
        self.rise = {d: 0.0 for d in self.deployments}
        self.fall = {d: 0.0 for d in self.deployments}

    def published(self, demand: Mapping[str, float]) -> None:
        """The rates just published (the reference of the accumulated evidence, which restarts for every
        deployment whose rate changed); call it at each publication."""
        for d, v in demand.items():
            if d in self.reference and v != self.reference[d]:
                self.reference[d] = float(v)
                self.rise[d] = self.fall[d] = 0.0

    def observe(self, since: float, at: float, counts: Mapping[str, int]) -> None:
        """Record ``counts[d]`` arrivals in ``[since, at)``; deployments not named had none."""
        lo, peak = at - self.tuning.avg_s, self.tuning.peak_s
        for d in self.deployments:
            w = self.windows[d]
            n = int(counts.get(d, 0))
            w.append((since, at, n))
            self._accumulate(d, n, at - since)
            while w and w[0][1] <= lo:
                w.popleft()
            m = self.means[d]
            m.append((at, self._mean(d, at)))
            while m[0][0] <= at - peak:
                m.popleft()

    def _accumulate(self, d: str, n: int, span: float) -> None:
        """Add a report of ``n`` arrivals over ``span`` seconds to ``d``'s CUSUM sums (module docstring)."""
        t = self.tuning
        r = max(self.reference[d], t.floor)
        up, down = 1 + 2 * t.up, max(1 - 2 * t.down, 0.1)
        self.rise[d] = max(0.0, self.rise[d] + n * math.log(up) - (up - 1) * r * span)
        self.fall[d] = max(0.0, self.fall[d] + n * math.log(down) - (down - 1) * r * span)

    def _mean(self, d: str, at: float) -> float:
        """Arrivals over the time covered by the windows ending in the last avg_s, the prior filling in
        for the part of that span before the first observation."""
        lo = at - self.tuning.avg_s
        n = 0.0
        covered = 0.0
        for since, end, c in self.windows[d]:
            n += c
            covered += end - since
        overlap = self.start - max(self.start - self.tuning.avg_s, lo)
        if overlap > 0:
            n += self.prior[d] * overlap
            covered += overlap
        return n / covered if covered > 0 else 0.0

    def surprise(self, d: str, rate: float, *, up: bool) -> float:
        """How many Poisson deviations above (``up``) or below what ``rate`` (req/s, at least ``floor``)
        predicts lie the counts of the most surprising suffix of ``d``'s recent reports."""
        rate = max(rate, self.tuning.floor)
        sign = 1.0 if up else -1.0
        n = 0
        span = 0.0
        worst = 0.0
        for since, end, c in reversed(self.windows[d]):
            n += c
            span += end - since
            if span > 0:  # Anscombe's transform: Poisson counts on a scale of unit deviation, tails included
                worst = max(worst, sign * 2 * (math.sqrt(n + 0.375) - math.sqrt(rate * span + 0.375)))
        return worst

    def backlog(self, waiting: Mapping[str, int]) -> None:
        """Record the requests waiting now per deployment (those not named wait none)."""
        self.waiting = {d: int(n) for d, n in waiting.items() if d in self.prior and n > 0}

    def backlog_rate(self, d: str) -> float:
        """The rate that serves ``d``'s waiting requests within ``avg_s`` (the estimate's floor)."""
        return self.waiting.get(d, 0) / self.tuning.avg_s

    def estimate(self) -> dict[str, float]:
        """The current estimate per deployment (req/s)."""
        return {d: max(max(v for _, v in self.means[d]), self.backlog_rate(d)) for d in self.deployments}


def moved(old: Mapping[str, float], new: Mapping[str, float], estimator: DemandEstimator) -> bool:
    """Whether ``new`` differs from the published ``old`` by a change both large and real, judged on
    ``estimator``'s tuning and recent counts (see the module docstring)."""
    t = estimator.tuning
    for d, v in new.items():
        last = old.get(d, 0.0)
        if estimator.backlog_rate(d) > 0 and (last <= 0 or v < last):
            if last <= 0:
                return True  # requests wait for a deployment planned at nothing
            continue  # a fall while requests wait: they need what is planned
        large = (v > last and v - last > max(t.up * last, t.floor)) or (
            v < last and last - v > max(t.down * last, t.floor)
        )
        if large and (
            abs(v - last) > NOISE_Z * math.sqrt(max(last, t.floor) / t.avg_s)
            or estimator.surprise(d, last, up=v > last) > NOISE_Z
            or (estimator.rise if v > last else estimator.fall).get(d, 0.0) > CUSUM_H
        ):
            return True
    return False
