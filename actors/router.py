"""The router: places requests on live instances, retries what a lost instance held, reports traffic.

Placement: a request goes to one of its deployment's serving entry instances (aggregated or prefill),
drawn with probability proportional to the instances' capacity (the template's req/s at the deployment's
shape, as the simulator routes). The draw is a hash of (seed, request id, attempt), so it does not depend
on the order in which requests are handled. A prefill instance's ``handoff`` is sent on, the same way, to
a serving decode instance of the same region with the KV transfer's bandwidth. A request with no
instance to go to waits (``queue_timeout_s``, then it fails as ``no_capacity``).

KV pairing: a decode template meets its TPOT only behind a prefill sender whose slowest NIC reaches its
``kv_min_nic`` (``kv_need``: template id -> bytes/s), so a handoff goes only to such decode instances, as
the allocation pairs pools and the simulator hands off. When all of them are full it waits for one (and
fails as ``no_decode_capacity`` after ``queue_timeout_s``). When the region has none at all (a plan change
or a loss left only slower-priced pairs) it goes to any decode instance rather than fail: the engine
prices the transfer at the pair's actual NIC (``WorkItem.kv_nic``), so the late tokens are counted
against the SLO as they are.

Bounds (overload): an instance holds at most ``weight × (service_s + instance_queue_s)`` of the
router's requests at once (a full instance is skipped): by Little's law the requests it serves at its
capacity ``weight`` while each takes ``service_s`` (the SLO's time for one request in its mode: TTFT plus
the mean output times TPOT when aggregated, TTFT for prefill, the output times TPOT for decode), plus
``instance_queue_s`` of waiting work. A bound without the service time would cap an instance whose
requests take longer than ``instance_queue_s`` below its capacity. Requests with nowhere to go wait, at most
``max_queue`` per deployment: beyond that the newest fail at once as ``queue_full``. So under any load the
router's and the engines' queues stay bounded, and what cannot be served is shed with a reason.

Retries: when the fleet reports an instance lost, each request it held is placed again (attempt + 1, from
its prompt; its first token, if one was already streamed, keeps its time); after ``max_attempts`` it fails
as ``retries_exhausted``. A draining instance's unstarted requests come back and are placed again without
counting a retry. At the end of a run (``req.finish``) whatever is still open fails as ``unfinished``, so
every arrival ends completed or failed with a reason.

Reports, every ``report_s``: ``req.counts`` (arrivals per deployment whose arrival time has passed, for
the demand monitor), ``req.stats`` (totals, SLO attainment and latency quantiles per deployment; a
request waits (``queued``, the demand monitor's backlog) at the router or at an instance that has not
started it, as the instance's last report says (``Completions.waiting``), and is in flight otherwise) and
``req.latency`` (the window's TTFT and TPOT samples). A completion meets the SLO when its TTFT and its TPOT
(time per output token after the first) are within the deployment's targets.

Delivery is prompt (``actors.base``): the router applies its messages within ``HOP_S`` of their arrival
and places what waits at once (``on_wake``), not at the next tick; its reports keep the tick.

The HTTP gateway's requests (an arrival batch with ``reply``) are routed the same way; their instances
report token progress as the engine makes it, and the router relays progress and outcomes to the gateway
(``req.result``) at the end of the instant in which it applied them. Requests the gateway proxied to an
instance's own HTTP endpoint (``req.proxied``) are only counted as arrivals, for the demand monitor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from actors.base import TickActor
from coral.kernel import Envelope
from coral.messages.control import ROUTER, SloChanged
from coral.messages.fleet import ROUTABLE_STATES, FleetUpdate, InstanceInfo
from coral.messages.mesh import MeshTiming
from coral.messages.requests import (
    ArrivalBatch,
    ArrivalCounts,
    Completions,
    DeploymentTraffic,
    Dispatch,
    FinishTraffic,
    LatencySamples,
    Outcome,
    ProxiedArrivals,
    RequestResults,
    RequestSpec,
    RoutingStats,
    WorkItem,
)
from coral.routing import instance_bound, kv_compatible, pick, uniform
from coral.scenario import Deployment
from coral.sim.report import LogHist
from coral.workload import Slo


@attrs.define
class OpenRequest:
    """A request the router is responsible for until it completes or fails."""

    spec: RequestSpec
    attempt: int = 0
    instance: str = ""
    phase: str = "entry"  # entry | decode
    t_first: float = -1.0
    handoff_t: float = 0.0
    kv_nic: float = 0.0
    region: str = ""
    queued_at: float | None = None
    origin: str = ""
    progress: bool = False


@attrs.define
class TrafficStats:
    """Totals of one deployment."""

    arrivals: int = 0
    dispatched: int = 0
    completed: int = 0
    failed: int = 0
    failed_by: dict[str, int] = attrs.field(factory=dict)
    retries: int = 0
    slo_met: int = 0
    win_met: int = 0
    win_done: int = 0
    ttft: LogHist = attrs.field(factory=LogHist)
    tpot: LogHist = attrs.field(factory=LogHist)
    e2e: LogHist = attrs.field(factory=LogHist)
    win_ttft: list[float] = attrs.field(factory=list)
    win_tpot: list[float] = attrs.field(factory=list)


@attrs.frozen
class _Places:
    """Where requests may go (``Router.places``)."""

    entry: dict[str, list[InstanceInfo]]
    decode: dict[tuple[str, str], list[InstanceInfo]]
    bound: dict[str, int]


def _inst_order(i: InstanceInfo) -> tuple[int, str]:
    return (len(i.id), i.id)


class Router(TickActor):
    """Routes requests to instances (see the module docstring)."""

    prompt = True

    def __init__(
        self,
        name: str = ROUTER,
        *,
        timing: MeshTiming,
        deployments: Sequence[Deployment],
        seed: int,
        kv_need: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(name, tick_s=timing.tick_s, subscribe=["fleet.update", "slo.changed"])
        self.timing = timing
        self.seed = seed
        self.kv_need = dict(kv_need or {})
        self.slo: dict[str, Slo] = {d.name: d.slo for d in deployments}
        self.mean_out = {d.name: d.shape.mean_out for d in deployments}
        self.stats: dict[str, TrafficStats] = {d.name: TrafficStats() for d in deployments}
        self.open: dict[int, OpenRequest] = {}
        self.todo: set[int] = set()
        self.serving: list[InstanceInfo] = []
        self.known: dict[str, InstanceInfo] = {}
        self.uncounted: list[tuple[float, str]] = []
        self.last_report: float | None = None
        self.report_every = timing.ticks(timing.report_s)
        self.ticks = 0
        self.finishing = False
        self.seq = 0
        self.replies: dict[str, list[Outcome]] = {}
        self.waiting_at: dict[str, int] = {}
        """Per instance, the router's requests its engine holds but has not started (its last report)."""
        self.at_instance: dict[str, set[int]] = {}
        """Per instance, the open requests sent to it (``OpenRequest.instance``); kept by ``_assign``."""
        self._places: _Places | None = None

    # -- inputs --------------------------------------------------------------------------------------

    async def on_message(self, env: Envelope) -> None:
        msg = env.msg
        if isinstance(msg, ArrivalBatch):
            ends_only = frozenset(msg.ends_only)
            for spec in msg.requests:
                if spec.deployment not in self.stats or spec.id in self.open:
                    continue
                origin, progress = (env.source, spec.id not in ends_only) if msg.reply else ("", False)
                self.open[spec.id] = OpenRequest(spec, origin=origin, progress=progress)
                self.todo.add(spec.id)
                self.stats[spec.deployment].arrivals += 1
                if not msg.resubmitted:
                    self.uncounted.append((spec.t, spec.deployment))
        elif isinstance(msg, ProxiedArrivals):
            for d, n in sorted(msg.counts.items()):
                if d in self.stats:
                    self.uncounted.extend([(msg.at, d)] * max(int(n), 0))
        elif isinstance(msg, Completions):
            self._outcomes(msg)
        elif isinstance(msg, FleetUpdate):
            for i in msg.instances:
                self.known[i.id] = i
            self.serving = sorted((i for i in msg.instances if i.state in ROUTABLE_STATES), key=_inst_order)
            self._places = None
            lost, stopped = set(msg.lost), set(msg.stopped)
            for iid in lost | stopped:
                self.waiting_at.pop(iid, None)
            hit = sorted(rid for iid in lost | stopped for rid in self.at_instance.get(iid, ()))
            for rid in hit:
                r = self.open[rid]
                if r.instance in lost:
                    self._retry(r)
                else:
                    self._assign(r, "")
                    self.todo.add(rid)
        elif isinstance(msg, SloChanged):
            self.slo[msg.deployment] = Slo(msg.ttft_s, msg.tpot_s, msg.attainment)
            self._places = None
        elif isinstance(msg, FinishTraffic):
            self.finishing = True

    def _outcomes(self, msg: Completions) -> None:
        info = self.known.get(msg.instance)
        if msg.waiting >= 0:
            self.waiting_at[msg.instance] = msg.waiting
        for o in msg.outcomes:
            r = self.open.get(o.id)
            if r is None or r.instance != msg.instance:
                continue  # a stale report from an attempt already given up
            if o.kind == "progress":
                self._relay(r, o)
            elif o.kind == "done":
                self._complete(r, o.t, o.t_first)
            elif o.kind == "failed":
                self._fail(r, o.reason or "engine")
            elif o.kind == "handoff" and info is not None:
                r.phase = "decode"
                r.t_first = o.t_first if r.t_first < 0 else r.t_first
                r.handoff_t = o.t
                r.kv_nic = info.kv_nic
                r.region = info.region
                self._assign(r, "")
                self.todo.add(o.id)
            else:  # returned by a draining instance (or a handoff from an instance never seen)
                self._assign(r, "")
                self.todo.add(o.id)

    def _retry(self, r: OpenRequest) -> None:
        r.attempt += 1
        self.stats[r.spec.deployment].retries += 1
        if r.attempt >= self.timing.max_attempts:
            self._fail(r, "retries_exhausted")
            return
        r.phase = "entry"
        self._assign(r, "")
        self.todo.add(r.spec.id)

    def _complete(self, r: OpenRequest, t_done: float, t_first: float) -> None:
        spec = r.spec
        st = self.stats[spec.deployment]
        slo = self.slo[spec.deployment]
        first = r.t_first if r.t_first >= 0 else t_first
        ttft = first - spec.t
        st.ttft.add(ttft)
        st.e2e.add(t_done - spec.t)
        ok = ttft <= slo.ttft_s
        if spec.out > 1:
            tpot = (t_done - first) / (spec.out - 1)
            st.tpot.add(tpot)
            ok = ok and tpot <= slo.tpot_s
        st.win_ttft.append(ttft)
        if spec.out > 1:
            st.win_tpot.append(tpot)
        st.completed += 1
        st.win_done += 1
        if ok:
            st.slo_met += 1
            st.win_met += 1
        self._relay(r, Outcome(spec.id, "done", t_done, first, tokens=spec.out))
        self._assign(r, "")
        del self.open[spec.id]
        self.todo.discard(spec.id)

    def _fail(self, r: OpenRequest, reason: str) -> None:
        st = self.stats[r.spec.deployment]
        st.failed += 1
        st.win_done += 1
        st.failed_by[reason] = st.failed_by.get(reason, 0) + 1
        self._relay(r, Outcome(r.spec.id, "failed", self.ctx.now(), r.t_first, reason))
        self._assign(r, "")
        del self.open[r.spec.id]
        self.todo.discard(r.spec.id)

    def _assign(self, r: OpenRequest, iid: str) -> None:
        """Set the instance ``r`` was sent to (``""``: none), keeping ``at_instance`` in step."""
        if r.instance:
            ids = self.at_instance[r.instance]
            ids.discard(r.spec.id)
            if not ids:
                del self.at_instance[r.instance]
        r.instance = iid
        if iid:
            self.at_instance.setdefault(iid, set()).add(r.spec.id)

    def _relay(self, r: OpenRequest, o: Outcome) -> None:
        if r.origin:
            self.replies.setdefault(r.origin, []).append(o)

    def _need(self, i: InstanceInfo) -> float:
        return self.kv_need.get(i.template_id, 0.0)

    def bound(self, i: InstanceInfo) -> int:
        """The most of the router's requests instance ``i`` holds at once (see the module docstring)."""
        slo = self.slo[i.deployment]
        decode = self.mean_out[i.deployment] * slo.tpot_s
        return instance_bound(i.weight, i.mode, slo.ttft_s, decode, self.timing.instance_queue_s)

    # -- the tick ------------------------------------------------------------------------------------

    async def on_tick(self, now: float) -> None:
        self.ticks += 1
        if self.last_report is None:
            self.last_report = now
        await self._route(now)
        if self.finishing:
            for rid in sorted(self.open):
                self._fail(self.open[rid], "unfinished")
            self.finishing = False
            await self._report(now, final=True)
        elif self.ticks % self.report_every == 0:
            await self._report(now)
        await self._reply(now)

    async def on_wake(self, now: float) -> None:
        if self.todo:
            await self._route(now)
        await self._reply(now)

    async def _reply(self, now: float) -> None:
        replies, self.replies = self.replies, {}
        for origin in sorted(replies):
            await self.ctx.send(origin, RequestResults(now, tuple(replies[origin])))

    def places(self) -> _Places:
        """The serving instances by deployment (entry) and by deployment and region (decode), and their
        bounds; rebuilt after a fleet or SLO change."""
        if self._places is None:
            entry: dict[str, list[InstanceInfo]] = {}
            decode: dict[tuple[str, str], list[InstanceInfo]] = {}
            for i in self.serving:
                if i.mode == "decode":
                    decode.setdefault((i.deployment, i.region), []).append(i)
                else:
                    entry.setdefault(i.deployment, []).append(i)
            self._places = _Places(entry, decode, {i.id: self.bound(i) for i in self.serving})
        return self._places

    async def _route(self, now: float) -> None:
        places = self.places()
        entry, decode, cap = places.entry, places.decode, places.bound
        work: dict[str, list[WorkItem]] = {}
        keep: set[int] = set()
        at = self.at_instance
        for rid in sorted(self.todo):
            r = self.open.get(rid)
            if r is None or r.instance:
                continue
            spec = r.spec
            if r.phase == "entry":
                cands = entry.get(spec.deployment, [])
            else:
                cands = decode.get((spec.deployment, r.region), [])
                cands = kv_compatible(cands, r.kv_nic, self._need) or cands
            if cands and any(len(at.get(c.id, ())) >= cap[c.id] for c in cands):
                cands = [c for c in cands if len(at.get(c.id, ())) < cap[c.id]]
            if not cands:
                if r.queued_at is None:  # from its arrival: the feed hands the router requests a tick ahead
                    r.queued_at = max(now, spec.t) if r.phase == "entry" else now
                if now - r.queued_at > self.timing.queue_timeout_s:
                    self._fail(r, "no_capacity" if r.phase == "entry" else "no_decode_capacity")
                else:
                    keep.add(rid)
                continue
            inst = pick(cands, uniform(self.seed, rid, r.attempt, 0 if r.phase == "entry" else 1))
            self._assign(r, inst.id)
            r.queued_at = None
            self.stats[spec.deployment].dispatched += 1
            if r.phase == "entry":
                item = WorkItem(
                    rid, spec.deployment, spec.t, max(spec.t, now), spec.prompt, spec.out, r.attempt,
                    progress=r.progress,
                )  # fmt: skip
            else:
                item = WorkItem(
                    rid, spec.deployment, spec.t, r.handoff_t, spec.prompt, spec.out, r.attempt, 1, r.t_first,
                    r.kv_nic, r.progress,
                )  # fmt: skip
            work.setdefault(inst.id, []).append(item)
        waiting: dict[str, list[int]] = {}
        for rid in sorted(keep):
            waiting.setdefault(self.open[rid].spec.deployment, []).append(rid)
        for ids in waiting.values():
            for rid in ids[self.timing.max_queue :]:  # shed the newest beyond the bound
                self._fail(self.open[rid], "queue_full")
                keep.discard(rid)
        self.todo = keep
        for iid in sorted(work, key=lambda s: (len(s), s)):
            info = self.known[iid]
            await self.ctx.send(info.head, Dispatch(iid, tuple(work[iid])))

    async def _report(self, now: float, *, final: bool = False) -> None:
        counts: dict[str, int] = {}
        later = []
        for t, d in self.uncounted:
            if t < now:
                counts[d] = counts.get(d, 0) + 1
            else:
                later.append((t, d))
        self.uncounted = later
        since = self.last_report if self.last_report is not None else now
        self.last_report = now
        await self.ctx.publish(ArrivalCounts(now, since, counts))
        in_flight: dict[str, int] = {}
        queued: dict[str, int] = {}
        held: dict[str, int] = {}
        for r in self.open.values():
            if not r.instance and r.spec.t > now:
                continue  # fed ahead of its arrival (the feed's next tick): it waits for nothing yet
            side = in_flight if r.instance else queued
            side[r.spec.deployment] = side.get(r.spec.deployment, 0) + 1
            if r.instance:
                held[r.instance] = held.get(r.instance, 0) + 1
        for iid in sorted(held):  # sent to an instance but not started there: waiting too
            info = self.known.get(iid)
            waiting = min(self.waiting_at.get(iid, 0), held[iid])
            if info is not None and waiting > 0:
                in_flight[info.deployment] -= waiting
                queued[info.deployment] = queued.get(info.deployment, 0) + waiting
        await self.ctx.publish(
            LatencySamples(
                now,
                since,
                {d: tuple(st.win_ttft) for d, st in self.stats.items() if st.win_ttft},
                {d: tuple(st.win_tpot) for d, st in self.stats.items() if st.win_tpot},
            )
        )
        deps = []
        for d, st in self.stats.items():
            deps.append(
                DeploymentTraffic(
                    d,
                    st.arrivals,
                    st.dispatched,
                    st.completed,
                    st.failed,
                    dict(sorted(st.failed_by.items())),
                    st.retries,
                    in_flight.get(d, 0),
                    queued.get(d, 0),
                    st.slo_met,
                    st.ttft.quantile(0.5),
                    st.ttft.quantile(0.99),
                    st.tpot.quantile(0.5),
                    st.tpot.quantile(0.99),
                    st.e2e.quantile(0.5),
                    st.win_met / st.win_done if st.win_done else -1.0,
                )
            )
            st.win_met = st.win_done = 0
            st.win_ttft.clear()
            st.win_tpot.clear()
        self.seq += 1
        await self.ctx.publish(RoutingStats(self.seq, now, tuple(deps), final))
