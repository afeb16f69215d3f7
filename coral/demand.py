"""The demand estimate of a deployment from its arrival counts, and when a change of it is worth a re-plan.

Estimator (``DemandEstimator``), per deployment: the arrival rate over the last ``avg_s`` seconds (counts
over the covered time), held at its maximum over the last ``peak_s`` seconds, so that a burst is covered
at once and the estimate falls only after the burst has left the peak window. It starts from a prior
(the scenario's demand at time 0), entered as one observation of ``avg_s`` seconds at the prior rate.

``moved``: an estimate is worth publishing (and re-planning for) when some deployment's rose by more
than ``up`` (relative) or fell by more than ``down`` since the last published value, and by at least
``floor`` req/s either way (asymmetric, so that noise does not trigger scale-down re-plans).

The mesh's demand monitor (``actors.demand``) and the simulator (``coral.sim``, ``SimConfig.monitor``)
both use it, so that they re-plan for the same estimates at the same moments.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from coral.messages.mesh import DemandTuning


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

    def observe(self, since: float, at: float, counts: Mapping[str, int]) -> None:
        """Record ``counts[d]`` arrivals in ``[since, at)``; deployments not named had none."""
        lo, peak = at - self.tuning.avg_s, self.tuning.peak_s
        for d in self.deployments:
            w = self.windows[d]
            w.append((since, at, int(counts.get(d, 0))))
            while w and w[0][1] <= lo:
                w.popleft()
            m = self.means[d]
            m.append((at, self._mean(d, at)))
            while m[0][0] <= at - peak:
                m.popleft()

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

    def estimate(self) -> dict[str, float]:
        """The current estimate per deployment (req/s)."""
        return {d: max(v for _, v in self.means[d]) for d in self.deployments}


def moved(old: Mapping[str, float], new: Mapping[str, float], tuning: DemandTuning) -> bool:
    """Whether ``new`` differs from the published ``old`` enough to publish (see the module docstring)."""
    t = tuning
    for d, v in new.items():
        last = old.get(d, 0.0)
        if v > last and v - last > max(t.up * last, t.floor):
            return True
        if v < last and last - v > max(t.down * last, t.floor):
            return True
    return False
