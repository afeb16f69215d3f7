"""Run protocol: how a mesh run was set up, and where it ended (the first and last records of a journal).

``mesh.setup`` (``MeshSetup``) is published once before any actor starts: the scenario's TOML text, the
seed, the timing, the cloud, the catalog and perf-model identity and every template the run may use. With
it a journal is self-contained: ``coral replay`` rebuilds the same mesh from it. ``mesh.end``
(``MeshEnd``) marks the virtual time at which the run stopped.

The run is bulk-synchronous on the kernel clock: every actor ticks at the same instants (multiples of
``tick_s``) and a message takes effect at the receiver's first tick after it was received. Chains of
actors therefore add one tick per hop, which the timing below accounts for: arrivals reach the router
``lookahead_ticks`` ahead of their time. The router and the stage workers apply their messages within a
1/1024 s hop instead (``actors.base``), and decode instances run their engine two hops behind the clock
so that a KV handoff (prefill worker -> router -> decode worker) arrives before the engine passes its
time (``actors.worker``).
"""

from __future__ import annotations

import math

import attrs

from coral.errors import CoralError
from coral.kernel import message
from coral.templates import Template

SETUP_VERSION = 1

INPUT_SOURCES = ("feed.market", "feed.traffic", "feed.faults", "operator", "gateway", "solver")
"""Senders of external inputs: what a replay feeds into a fresh mesh."""
INPUT_TAGS = ("mkt.quote", "req.arrivals", "req.finish", "fleet.fault", "req.proxied", "plan.answer")
DECISION_TAGS = (
    "mkt.update",
    "dem.update",
    "plan.new",
    "fleet.update",
    "fleet.action",
    "fleet.node_lost",
    "fleet.unmet",
    "req.counts",
    "req.stats",
    "ctl.result",
    "slo.changed",
)
"""Published decisions that a replay must reproduce exactly."""


class SetupError(CoralError):
    """A mesh setup with an impossible value; the message names the field."""


def _dyadic(x: float) -> bool:
    return x > 0 and math.isfinite(x) and (x * 1024).is_integer()


@attrs.frozen
class MeshTiming:
    """Clock discipline of a run (seconds of the kernel clock), and the router's bounds.

    Overload: an instance is given at most ``weight × (service_s + instance_queue_s)`` requests at once
    (those in service at its capacity, and what it serves in ``instance_queue_s``; ``actors.router``);
    the rest wait in the router, at most ``max_queue`` per deployment: beyond that the
    newest fail at once as ``queue_full`` (shed, not queued without bound). The defaults (10 s of work
    per instance, 500 waiting per deployment) recovered the SLO 80 s after a minute at 10x the capacity,
    where 120 s and 10,000 had not recovered it 180 s after (``bench/overload.py``).

    ``tick_s`` must be a multiple of 1/1024 so that tick times add up exactly in floating point.
    """

    tick_s: float = 1.0
    heartbeat_s: float = 5.0
    heartbeat_timeout_s: float = 15.0
    report_s: float = 5.0
    lookahead_ticks: int = 2
    warmup_s: float = 10.0
    drain_s: float = 60.0
    queue_timeout_s: float = 60.0
    max_attempts: int = 4
    max_queue: int = 500
    instance_queue_s: float = 10.0

    def check(self) -> MeshTiming:
        """Return self if valid; raise SetupError naming the field otherwise."""
        if not _dyadic(self.tick_s):
            raise SetupError(f"tick_s: must be a positive multiple of 1/1024 s, got {self.tick_s!r}")
        for name in ("heartbeat_s", "heartbeat_timeout_s", "report_s", "queue_timeout_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and v >= self.tick_s and math.isfinite(v)):
                raise SetupError(f"{name}: must be at least one tick ({self.tick_s} s), got {v!r}")
        if self.heartbeat_timeout_s <= self.heartbeat_s:
            raise SetupError(
                f"heartbeat_timeout_s: must exceed heartbeat_s ({self.heartbeat_s}), got {self.heartbeat_timeout_s}"
            )
        if self.lookahead_ticks < 2:
            raise SetupError(f"lookahead_ticks: must be at least 2, got {self.lookahead_ticks}")
        if not self.warmup_s >= 6 * self.tick_s:
            raise SetupError(f"warmup_s: must be at least 6 ticks ({6 * self.tick_s} s), got {self.warmup_s}")
        if not (self.warmup_s / self.tick_s).is_integer():
            raise SetupError(f"warmup_s: must be a whole number of ticks, got {self.warmup_s}")
        if not self.drain_s >= 0:
            raise SetupError(f"drain_s: must not be negative, got {self.drain_s}")
        if self.max_attempts < 1:
            raise SetupError(f"max_attempts: must be at least 1, got {self.max_attempts}")
        if not (isinstance(self.max_queue, int) and self.max_queue >= 1):
            raise SetupError(f"max_queue: must be an integer >= 1, got {self.max_queue!r}")
        if not (math.isfinite(self.instance_queue_s) and self.instance_queue_s >= self.tick_s):
            raise SetupError(
                f"instance_queue_s: must be at least one tick ({self.tick_s} s), got {self.instance_queue_s!r}"
            )
        return self

    def ticks(self, seconds: float) -> int:
        """Whole ticks in ``seconds`` (at least 1)."""
        return max(1, round(seconds / self.tick_s))


@attrs.frozen
class Host:
    """A machine the user has (for the static-hosts cloud)."""

    name: str
    region: str
    node: str


@attrs.frozen
class CloudSetup:
    """The cloud provider: ``sim`` (simulated: provisioning delay, availability, faults) or ``hosts``.

    ``startup_s`` is an engine's fixed start-up on top of its weight load.
    """

    kind: str = "sim"
    provision_s: float = 30.0
    startup_s: float = 60.0
    hosts: tuple[Host, ...] = ()

    def check(self) -> CloudSetup:
        if self.kind not in ("sim", "hosts"):
            raise SetupError(f"cloud.kind: must be 'sim' or 'hosts', got {self.kind!r}")
        for name in ("provision_s", "startup_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise SetupError(f"cloud.{name}: must be a number >= 0, got {v!r}")
        if self.kind == "hosts" and not self.hosts:
            raise SetupError("cloud.hosts: the static-hosts cloud needs at least one host")
        names = [h.name for h in self.hosts]
        if len(set(names)) != len(names):
            raise SetupError("cloud.hosts: host names must be unique")
        return self


@attrs.frozen
class DemandTuning:
    """The demand monitor's estimator: the mean over ``avg_s``, held at its peak over ``peak_s``; an update
    is published when the estimate rises by more than ``up`` or falls by more than ``down`` (relative),
    and by at least ``floor`` req/s."""

    avg_s: float = 20.0
    peak_s: float = 60.0
    up: float = 0.10
    down: float = 0.25
    floor: float = 0.1

    def check(self) -> DemandTuning:
        if not (self.avg_s > 0 and self.peak_s >= self.avg_s):
            raise SetupError(f"demand: need avg_s > 0 and peak_s >= avg_s, got {self.avg_s}, {self.peak_s}")
        for name in ("up", "down", "floor"):
            if not getattr(self, name) >= 0:
                raise SetupError(f"demand.{name}: must not be negative, got {getattr(self, name)}")
        return self


@message("mesh.setup")
@attrs.frozen
class MeshSetup:
    """Everything that determines a run besides its external inputs."""

    scenario_name: str
    scenario_path: str
    scenario_toml: str
    seed: int
    policy: str
    duration_s: float
    deadline_s: float
    timing: MeshTiming
    cloud: CloudSetup
    demand: DemandTuning
    warm_start: bool
    deterministic: bool
    catalog_files: tuple[str, ...]
    profile_files: tuple[str, ...]
    catalog_digest: str
    perf_version: str
    templates: tuple[Template, ...]
    columns: str = "all"
    version: int = SETUP_VERSION


@message("mesh.resumed")
@attrs.frozen
class MeshResumed:
    """``coral up --resume``: the run goes on from kernel time ``at`` after a crash (journal record
    ``from_seq`` was the last one before it). Reconciliation with the provider: ``adopted`` instances
    (restored from the journal or, by their tags, from the provider), nodes ``released`` (unknown ones,
    per the flag, and those of instances that could not be restored), nodes ``lost`` (in the journal, gone
    at the provider); ``resubmitted`` requests were open at the crash and go to the router again."""

    at: float
    from_seq: int
    adopted: tuple[str, ...]
    released: tuple[str, ...]
    lost: tuple[str, ...]
    resubmitted: int
    torn_bytes: int = 0


@message("mesh.end")
@attrs.frozen
class MeshEnd:
    """The run stopped at ``at`` (kernel time) for ``reason``."""

    at: float
    reason: str
