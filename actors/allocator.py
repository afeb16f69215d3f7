"""The allocator: re-plans on demand, market and fleet changes, and publishes each plan with its diff.

When something changed (a demand, market or fleet update, an operator command, or, at a tick, the
scenario's re-plan interval elapsed), and unless paused, it builds a ``PlanRequest`` from the latest
demand, market and live fleet, solves it in the solver process it owns (``actors.solver_process``:
spawned at its start, which ends when the child is ready or fails after ``READY_S`` naming the cause;
killed at its stop), and publishes ``NewPlan``. Delivery is prompt (``actors.base``): a change is planned
for within ``HOP_S`` of its arrival, not at the next tick; the changes that arrive at one instant give
one plan.

Publication time (the rule): a plan started at kernel time t (its request's ``at``, with the demand,
market, fleet and settings as applied at t) is published at the first of the actor's instants that is at
or after t + D and after the instant its answer reached the mesh (``next_instant`` of it when that is
later than t + D), where D is the planner's deadline (``deadline_s``) in simulated seconds, or 0 when every
solve runs to completion (``deterministic``: there is no deadline to wait for; then it plans and publishes
at t, the clock standing for the solve). Between t and the landing the actor is idle, so the mesh's clock
runs while the child solves (``SolverProcess.submit`` at t); the solver keeps D as its deadline in wall
seconds whatever the speed, so the plan's quality does not depend on the speed.

How the answer's instant is known (``landing``):

- ``answer`` (every live run under a deadline): a task of the run (``Answers.run``) collects the result in
  wall time while the clock runs, and the driver delivers ``PlanAnswer(seq)`` (sender ``solver``) at the
  kernel time then: at a paced speed, the paced instant at which the answer arrived (the doorbell makes
  the driver step there at once); at ``--speed max``, the instant the plan started, the clock standing
  there until the answer came, so that the plan lands at exactly t + D as before. The answer is an input
  like an HTTP request: journaled, and fed again by a replay at its recorded time (``actors.replay``),
  whose allocator then collects its own re-solve (same effort, same result) and publishes at the same
  instant. Why not wait at t + D: at 60x, D = 1 s is 17 ms of wall while a solve takes 0.1-0.4 s, and a
  clock that stood for it fell 6-24 simulated s behind at each plan; the cost moves into the plan's delay
  (its landing minus t), which the status line and ``just bench mesh`` show per plan. Two live runs of
  one scenario at a paced speed may thus land plans at different instants, as they may get HTTP
  requests at different instants; the journal of each replays exactly.
- ``deadline`` (``Allocator``'s default, and the replay of a journal recorded before answers were
  journaled): at t + D it waits for the result if the child has not finished (the clock stands there).

One plan is in flight at a time: the changes that arrive while one is in flight are applied to the actor's
state as they come, and coalesce into the next plan, started at the instant the one in flight is published
(so at its landing L, published at L + D at the earliest); a plan in flight is published even if the
allocator was paused or a template forbidden meanwhile (the next plan follows the new settings). The
re-plan interval counts from the start of the last plan.

Its operator settings (paused, churn factor, pins, forbidden templates) are published as
``AllocatorState`` at its first tick and whenever one changed, so that every client sees them, not only
the one that sent the command.

Templates: for each deployment the library holds every stored template of its model and shape on the
scenario's node types. A deployment uses those built for its SLO; after an SLO change to one that has no
templates of its own, those built for a stricter SLO (whose placements meet the new one, with capacities
measured at the stricter SLO, a safe under-estimate). Forbidden templates are left out; a pinned
deployment uses only its pinned template. The churn-penalty factor overrides the scenario's.

Deadline: the scenario's ``deadline_s`` bounds the whole reaction, from the instant that handles a trigger
to the result, not only the solver: building the problem is timed and subtracted, and ``PUBLISH_SHARE``
of the deadline is kept for assembling and publishing the plan. The solver always
returns a feasible plan within what is left (``solvers.allocation``).

Determinism: online the solve runs under that wall-clock deadline and the plan records the
solver effort it took (``Plan.effort``); given ``efforts`` (plan sequence -> effort, from a journal) the
allocator re-solves each plan with exactly that effort; with ``deterministic`` it solves without a
deadline (each phase to completion), so that a recording is reproducible on any machine.
``columns="generated"`` solves by column generation (``solve_allocation``): much faster MIPs, with
optimality proven over the generated columns only (the plan reports the LP bound).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence

import anyio
import attrs

from actors.base import TickActor, next_instant
from actors.solver_process import READY_S, Flight, SolverProcess
from coral.catalog.types import Catalog
from coral.kernel import Envelope
from coral.messages.control import (
    ALLOCATOR,
    AllocatorState,
    ForbidTemplate,
    PauseAllocator,
    PinTemplate,
    Replan,
    SetChurn,
    SetSlo,
    SloChanged,
)
from coral.messages.demand import DemandUpdate
from coral.messages.fleet import FleetUpdate
from coral.messages.market import MarketUpdate
from coral.messages.plan import NewPlan, PlanAnswer, PlanChange, PlanInputs
from coral.perf import PerfModel
from coral.plan import Plan, PlanRequest
from coral.scenario import Deployment, Scenario
from coral.templates import Template
from coral.workload import Slo
from solvers.allocation import AllocationProblem, AllocationResult, SolverEffort
from solvers.planning import Planner, ProgramColumns, policy_admits, to_plan

PUBLISH_SHARE = 0.12
"""Share of the reaction deadline kept for turning the solution into a plan and publishing it."""
MIN_SOLVE_SHARE = 0.25
"""The solver gets at least this share of the deadline, however long the problem took to build."""
TIMES_KEPT = 4096
"""How many plans' ``StepTimes`` the allocator keeps (the latest): a long run's history stays bounded."""
LANDINGS = ("answer", "deadline")
"""How a plan in flight learns when to land (see the module docstring)."""


def servable(templates: Sequence[Template]) -> bool:
    """Whether a set of templates can serve a deployment: an aggregated one, or prefill and decode."""
    modes = {t.mode for t in templates}
    return "aggregated" in modes or {"prefill", "decode"} <= modes


def meets(t: Template, slo: Slo) -> bool:
    """Whether a template built for ``t.slo`` also meets ``slo`` (its targets are at least as strict)."""
    return t.slo.ttft_s <= slo.ttft_s and t.slo.tpot_s <= slo.tpot_s and t.slo.attainment >= slo.attainment


def publish_delay(deadline_s: float, deterministic: bool) -> float:
    """D, the simulated seconds from a plan's trigger to its publication: the planner's deadline, or 0
    when every solve runs to completion (``deterministic``; there is no deadline to wait for)."""
    return 0.0 if deterministic else float(deadline_s)


@attrs.define(eq=False)
class StepTimes:
    """Wall seconds of the allocator's own work for one plan (reported by ``just bench mesh``; never a
    decision input): building the problem, handing it to the solver process, waiting for the result at
    the landing (0 when an answer was collected beforehand), and turning it into the published plan."""

    seq: int
    build_s: float
    submit_s: float
    wait_s: float = 0.0
    finish_s: float = 0.0


@attrs.define(eq=False)
class Pending:
    """A plan in flight: the solve submitted at ``req.at`` with what it needs to become a ``NewPlan``;
    ``result`` (or ``error``) once ``Answers`` collected it."""

    due: float
    flight: Flight
    planner: Planner
    req: PlanRequest
    prob: AllocationProblem
    index: list[tuple[Deployment, Template]]
    seq: int
    inputs: PlanInputs
    times: StepTimes
    result: AllocationResult | None = None
    error: Exception | None = None


class Answers:
    """A live run's plan answers (``landing="answer"``): ``run`` (a task of the run, outside every actor)
    collects each submitted solve's result in wall time and rings the mesh's doorbell; the driver takes the
    answers (``take``) at its next quiet point and delivers them as ``PlanAnswer`` inputs."""

    def __init__(self) -> None:
        self.flights: deque[tuple[SolverProcess, Pending]] = deque()
        """Plans submitted and not answered yet, oldest first (one at a time in practice)."""
        self.ready: list[PlanAnswer] = []
        self.ring: Callable[[], None] = lambda: None
        """Called when an answer is ready (the run sets it to ``Mesh.ring``)."""
        self._changed = anyio.Event()

    def watch(self, solver: SolverProcess, p: Pending) -> None:
        """Collect ``p``'s result (called by the allocator when it submits ``p``)."""
        self.flights.append((solver, p))
        self._poke()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def take(self) -> list[PlanAnswer]:
        """The answers ready since the last call, oldest first."""
        out, self.ready = self.ready, []
        return out

    async def wait(self, stop: anyio.Event | None = None) -> None:
        """Wait until no plan is left unanswered (``--speed max``: the clock stands meanwhile) or ``stop``."""
        if not self.flights:
            return
        async with anyio.create_task_group() as tg:

            async def stopped(stop: anyio.Event) -> None:
                await stop.wait()
                tg.cancel_scope.cancel()

            if stop is not None:
                tg.start_soon(stopped, stop)
            while self.flights:
                await self._changed.wait()
            tg.cancel_scope.cancel()

    async def run(self) -> None:
        """Collect results for ever (cancelled with the run)."""
        while True:
            while not self.flights:
                await self._changed.wait()
            solver, p = self.flights[0]
            started = time.perf_counter()
            try:
                p.result = await solver.collect_async(p.flight)
            except Exception as exc:  # raised in the allocator when the plan lands, as a collect there would
                p.error = exc
            p.times.wait_s = time.perf_counter() - started
            self.flights.popleft()
            self.ready.append(PlanAnswer(p.seq))
            self._poke()
            self.ring()


def effort_of(plan: Plan) -> SolverEffort:
    """The solver effort a plan recorded, as ``solve_allocation`` takes it back."""
    return SolverEffort.from_mapping(plan.effort)


class Allocator(TickActor):
    """Plans instances per region from demand, market and fleet (see the module docstring)."""

    prompt = True

    def __init__(
        self,
        name: str = ALLOCATOR,
        *,
        tick_s: float,
        scenario: Scenario,
        catalog: Catalog,
        perf: PerfModel,
        library: Mapping[str, Sequence[Template]],
        policy: str = "coral",
        deadline_s: float | None = None,
        deterministic: bool = False,
        efforts: Mapping[int, SolverEffort] | None = None,
        prior_demand: Mapping[str, float] | None = None,
        columns: str = "all",
        inspector: Callable[[Allocator, Envelope], Awaitable[bool]] | None = None,
        landing: str = "deadline",
        answers: Answers | None = None,
        solver_nice: int = 0,
    ) -> None:
        super().__init__(name, tick_s=tick_s, subscribe=["dem.update", "mkt.update", "fleet.update"])
        self.inspector = inspector
        """Answers the TUI's inspection requests (``actors.inspect.answer``) at once, not at a tick."""
        self.scenario = scenario
        self.catalog = catalog
        self.perf = perf
        self.library = {d.name: list(library.get(d.name, ())) for d in scenario.deployments}
        self.by_id = {t.id: t for ts in self.library.values() for t in ts}
        self.deployments: dict[str, Deployment] = {d.name: d for d in scenario.deployments}
        self.policy = policy
        self.deadline_s = deadline_s if deadline_s is not None else scenario.planner.deadline_s
        self.deterministic = deterministic
        self.columns = columns
        self.efforts = dict(efforts or {})
        self.demand = dict(prior_demand or {d.name: d.demand.at(0.0) for d in scenario.deployments})
        self.prices: dict[tuple[str, str], float] | None = None
        self.avail: dict[tuple[str, str], int] = {}
        self.current: dict[tuple[str, str, str], int] = {}
        self.inputs = PlanInputs()
        self.slo: dict[str, Slo] = {}
        self.forbidden: set[str] = set()
        self.pins: dict[str, str] = {}
        self.churn = scenario.planner.churn_factor
        self.paused = False
        self.shown: AllocatorState | None = None
        self.triggers: set[str] = {"initial"}
        self.last_plan: Plan | None = None
        self.last_plan_at = 0.0
        self.seq = 0
        self.solver: SolverProcess | None = None
        """The solver process (spawned at the first start, closed at the stop; a restart keeps it)."""
        self.solver_nice = solver_nice
        """How much the solver process lowers its CPU priority (``SolverProcess``'s ``nice``)."""
        self.delay_s = publish_delay(self.deadline_s, deterministic)
        """D: a plan started at t is published at t + D (see the module docstring)."""
        self.pending: Pending | None = None
        """The plan in flight: started, to be published at its ``due`` time (or its answer's, if later)."""
        if landing not in LANDINGS:
            raise ValueError(f"landing: expected one of {', '.join(LANDINGS)}, got {landing!r}")
        self.landing = landing
        self.answers = answers
        """Collects the answers of a live run with ``landing="answer"`` (None in a replay: its feed has them)."""
        self._columns: tuple[tuple[tuple[Slo, tuple[str, ...]], ...], ProgramColumns] | None = None
        """The allocation program's columns (``Planner.program_columns``), kept while each deployment's SLO
        and usable templates (their ids) stay the same: they depend on nothing else a plan changes."""
        self.answered: dict[int, float] = {}
        """Plan sequence -> the kernel time its ``PlanAnswer`` was received (``landing="answer"``)."""
        self.times: deque[StepTimes] = deque(maxlen=TIMES_KEPT)
        """The wall time of the allocator's own work per published plan (``StepTimes``), the latest ones."""

    async def started(self) -> None:
        """Spawn the solver process and wait for its ``Ready`` (at most ``READY_S``) before the actor counts
        as started, so that the mesh's clock does not run while the child imports highspy and numpy; build
        the first plan's program columns meanwhile too (``program_columns``)."""
        if self.solver is None:
            self.solver = SolverProcess(nice=self.solver_nice)
        await self.solver.start_async(READY_S)
        tpls = {d: self.usable(d) for d in self.deployments}  # the first plan's columns, before the clock runs
        self.program_columns(Planner(self.policy, self.scenario, self.catalog, self.perf, tpls, self.deadline_s))
        if self.pending is not None:  # a restart while a plan was in flight: it is still published on time
            self.wake_at(max(self.pending.due, next_instant(self.ctx.now())))

    async def on_stop(self) -> None:
        if self.solver is not None:
            self.solver.close()
            self.solver = None

    # -- templates -----------------------------------------------------------------------------------

    def usable(
        self, d: str, *, slo: Slo | None = None, forbidden: set[str] | None = None, pin: str | None = ""
    ) -> list[Template]:
        """The templates deployment ``d`` may use now (or under the given SLO, forbids and pin)."""
        s = slo if slo is not None else self.slo.get(d, self.deployments[d].slo)
        fb = self.forbidden if forbidden is None else forbidden
        p = self.pins.get(d) if pin == "" else pin
        cands = [t for t in self.library[d] if policy_admits(self.policy, t) and t.id not in fb]
        exact = [t for t in cands if t.slo == s]
        base = exact or [t for t in cands if meets(t, s)]
        if p is not None:
            base = [t for t in base if t.id == p]
        return base

    # -- inputs --------------------------------------------------------------------------------------

    async def handle(self, env: Envelope) -> None:
        if isinstance(env.msg, PlanAnswer):  # noted on receipt; it counts at instants after it (``on_wake``)
            self.answered.setdefault(env.msg.seq, self.ctx.now())
        if self.inspector is None or not await self.inspector(self, env):
            await super().handle(env)

    async def on_message(self, env: Envelope) -> None:
        msg = env.msg
        if isinstance(msg, DemandUpdate):
            self.demand = dict(msg.demand)
            self.inputs = attrs.evolve(self.inputs, demand_seq=msg.seq)
            self.triggers.add("demand")
        elif isinstance(msg, MarketUpdate):
            self.prices = msg.prices()
            self.avail = msg.availability()
            self.inputs = attrs.evolve(self.inputs, market_seq=msg.seq)
            self.triggers.add("market")
        elif isinstance(msg, FleetUpdate):
            self.current = msg.live_counts()
            self.inputs = attrs.evolve(self.inputs, fleet_seq=msg.seq)
            if msg.lost or msg.drained_by_operator:
                self.triggers.add("fleet")

    async def command(self, msg: object) -> tuple[str, str] | None:
        if isinstance(msg, Replan):
            self.triggers.add("operator")
        elif isinstance(msg, PauseAllocator):
            self.paused = msg.paused
        elif isinstance(msg, SetChurn):
            self.churn = float(msg.factor)
            self.triggers.add("churn")
        elif isinstance(msg, SetSlo):
            return await self._set_slo(msg)
        elif isinstance(msg, ForbidTemplate):
            return self._forbid(msg)
        elif isinstance(msg, PinTemplate):
            return self._pin(msg)
        else:
            return await super().command(msg)
        return None

    def _unknown_deployment(self, name: str) -> tuple[str, str] | None:
        if name not in self.deployments:
            return ("deployment", f"unknown deployment {name!r} (known: {', '.join(self.deployments)})")
        return None

    async def _set_slo(self, msg: SetSlo) -> tuple[str, str] | None:
        if (bad := self._unknown_deployment(msg.deployment)) is not None:
            return bad
        slo = Slo(float(msg.ttft_s), float(msg.tpot_s), float(msg.attainment))
        if not servable(self.usable(msg.deployment, slo=slo)):
            lib = [t for t in self.library[msg.deployment] if policy_admits(self.policy, t)]
            field = (
                "ttft_s"
                if not any(t.slo.ttft_s <= slo.ttft_s for t in lib)
                else "tpot_s"
                if not any(t.slo.tpot_s <= slo.tpot_s for t in lib)
                else "attainment"
            )
            model = self.deployments[msg.deployment].model
            return (
                field,
                f"no template of {model} meets TTFT {slo.ttft_s:g} s / TPOT {slo.tpot_s:g} s / attainment "
                f"{slo.attainment:g}; build them with `coral templates build` for that SLO",
            )
        self.slo[msg.deployment] = slo
        self.triggers.add("slo")
        await self.ctx.publish(SloChanged(msg.deployment, slo.ttft_s, slo.tpot_s, slo.attainment, self.ctx.now()))
        return None

    def _forbid(self, msg: ForbidTemplate) -> tuple[str, str] | None:
        tid = msg.template_id
        if tid not in self.by_id:
            return ("template_id", f"unknown template {tid!r}")
        if msg.forbid:
            trial = self.forbidden | {tid}
            for d in self.deployments:
                if servable(self.usable(d)) and not servable(self.usable(d, forbidden=trial)):
                    return (
                        "template_id",
                        f"forbidding {tid} leaves deployment {d!r} without a template that serves it",
                    )
            if any(p == tid for p in self.pins.values()):
                return ("template_id", f"template {tid} is pinned; unpin it first")
            self.forbidden = trial
        else:
            self.forbidden.discard(tid)
        self.triggers.add("templates")
        return None

    def _pin(self, msg: PinTemplate) -> tuple[str, str] | None:
        if (bad := self._unknown_deployment(msg.deployment)) is not None:
            return bad
        tid = msg.template_id
        if tid is None:
            self.pins.pop(msg.deployment, None)
        else:
            if tid not in self.by_id:
                return ("template_id", f"unknown template {tid!r}")
            if tid not in {t.id for t in self.usable(msg.deployment, pin=None)}:
                return ("template_id", f"template {tid} cannot serve deployment {msg.deployment!r} now")
            if self.by_id[tid].mode != "aggregated":
                return ("template_id", f"template {tid} is a {self.by_id[tid].mode} template; pin an aggregated one")
            self.pins[msg.deployment] = tid
        self.triggers.add("templates")
        return None

    # -- planning ------------------------------------------------------------------------------------

    def settings(self, now: float) -> AllocatorState:
        """The operator settings in force (published as ``ctl.alloc_state`` whenever they change)."""
        return AllocatorState(
            now, self.paused, float(self.churn), tuple(sorted(self.pins.items())), tuple(sorted(self.forbidden))
        )

    async def on_tick(self, now: float) -> None:
        if self.last_plan is not None and now - self.last_plan_at >= self.scenario.planner.replan_interval_s:
            self.triggers.add("interval")
        await self.on_wake(now)

    async def on_wake(self, now: float) -> None:
        state = self.settings(now)
        if self.shown is None or attrs.evolve(state, at=self.shown.at) != self.shown:
            self.shown = state
            await self.ctx.publish(state)
        if self.pending is not None:
            if self.landing == "answer" and not self.answered.get(self.pending.seq, math.inf) < now:
                return  # its PlanAnswer wakes the actor
            if now < self.pending.due:
                self.wake_at(self.pending.due)
                return
            await self.land()
        if self.paused or self.prices is None or not self.triggers:
            return
        trigger = "+".join(sorted(self.triggers))
        self.triggers.clear()
        await self.solve(now, trigger)

    def program_columns(self, planner: Planner) -> ProgramColumns:
        """``planner.program_columns()``, kept while the deployments' SLOs and the templates it plans over
        (their ids) stay the same."""
        key = tuple((d.slo, tuple(t.id for t in planner.templates[d.name])) for d in planner.scenario.deployments)
        if self._columns is None or self._columns[0] != key:
            self._columns = (key, planner.program_columns())
        return self._columns[1]

    def solver_process(self) -> SolverProcess:
        """The solver process (spawned here when the actor has not started it)."""
        if self.solver is None:
            self.solver = SolverProcess(nice=self.solver_nice)
        return self.solver

    async def solve(self, now: float, trigger: str) -> NewPlan | None:
        """Start a plan for the current state; publish it now when ``delay_s`` is 0 (returned), else at
        ``now + delay_s`` or at its answer, if later (``land``; None here)."""
        assert self.prices is not None
        t0 = time.perf_counter()  # wall time, reported only (``StepTimes``)
        sc = self.scenario
        if self.churn != sc.planner.churn_factor:
            sc = attrs.evolve(sc, planner=attrs.evolve(sc.planner, churn_factor=self.churn))
        if self.slo:  # the operator's SLOs: the columns' queueing headroom and the plan count them
            deps = tuple(attrs.evolve(d, slo=self.slo.get(d.name, d.slo)) for d in sc.deployments)
            sc = attrs.evolve(sc, deployments=deps)
        tpls = {d: self.usable(d) for d in self.deployments}
        planner = Planner(self.policy, sc, self.catalog, self.perf, tpls, self.deadline_s)
        columns = self.program_columns(planner)
        req = PlanRequest(now, dict(self.demand), dict(self.prices), dict(self.avail), dict(self.current), trigger)
        seq = self.seq + 1
        effort = self.efforts.get(seq)
        if effort is None and self.deterministic:
            effort = SolverEffort()

        started = time.perf_counter()  # transport-side timing: the deadline, never a decision input
        prob, index = planner.problem(req, columns)
        spent = time.perf_counter() - started
        left = max((1.0 - PUBLISH_SHARE) * self.deadline_s - spent, MIN_SOLVE_SHARE * self.deadline_s)
        solver = self.solver_process()
        flight = await solver.submit_async(prob, deadline_s=left, effort=effort, columns=self.columns)
        times = StepTimes(seq, started + spent - t0, time.perf_counter() - started - spent)
        self.seq = seq
        self.last_plan_at = now
        self.pending = Pending(now + self.delay_s, flight, planner, req, prob, index, seq, self.inputs, times)
        if self.delay_s == 0:
            return await self.land()
        self.wake_at(self.pending.due)
        if self.landing == "answer" and self.answers is not None:
            self.answers.watch(solver, self.pending)
        return None

    async def land(self) -> NewPlan:
        """Publish the plan in flight, with the result ``Answers`` collected, or else collected here (waiting
        for the solver process if it is not done: the clock stands meanwhile)."""
        p = self.pending
        assert p is not None
        self.pending = None
        self.answered = {k: v for k, v in self.answered.items() if k > p.seq}
        started = time.perf_counter()
        if p.error is not None:
            raise p.error
        res = p.result
        if res is None:
            res = await self.solver_process().collect_async(p.flight)
            p.times.wait_s = time.perf_counter() - started
            started = time.perf_counter()
        plan = to_plan(p.planner, p.req, p.prob, p.index, res, seq=p.seq)
        diff = tuple(PlanChange(d, t, r, n) for (d, t, r), n in plan.diff(self.last_plan).items())
        self.last_plan = plan
        msg = NewPlan(plan, diff, p.inputs)
        await self.ctx.publish(msg)
        p.times.finish_s = time.perf_counter() - started
        self.times.append(p.times)
        return msg
