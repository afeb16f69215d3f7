"""Control protocol: what an operator (the TUI, a script) sends to steer the mesh, and the answers.

Each command is a directed message to the actor that owns the setting (``owner_of(cmd)``), or to the
``operator`` gateway of ``coral up``, which forwards it at a quiet point of the run so that a recorded
journal replays it exactly. The owner validates it within 1/1024 s of its arrival (prompt delivery,
``actors.base``): a negative number, an unknown name or an impossible setting is refused. Either way it
answers with a ``CommandResult`` (as the reply to a request, and published on ``ctl.result``) naming the
field and the reason of a refusal; an accepted command is reflected in the next plan.

=====================  ==================  =========================================================
command                owner               effect
=====================  ==================  =========================================================
``SetDemand``          demand-monitor      fix a deployment's demand (req/s), or clear the override
``SetAvailability``    price-watcher       fix the nodes obtainable of (region, node type), or clear
``SetPrice``           price-watcher       fix the price of (region, node type), or clear
``SetSlo``             allocator           change a deployment's SLO (templates must exist for it)
``ForbidTemplate``     allocator           forbid (or allow again) a template
``PinTemplate``        allocator           serve a deployment only with one template, or unpin
``DrainInstance``      supervisor          drain and stop one instance (the allocator replaces it)
``Replan``             allocator           re-plan now
``PauseAllocator``     allocator           pause (no new plans) or resume
``SetChurn``           allocator           set the churn-penalty factor (>= 0)
``SetSpeed``           operator gateway    set the run's pace (``coral up --speed``); not an actor's
                                           setting, so a replay (unpaced) skips it
=====================  ==================  =========================================================
"""

from __future__ import annotations

import math

import attrs

from coral.kernel import message

OPERATOR = "operator"
"""The name of ``coral up``'s control gateway (send commands there for exact replay)."""

DEMAND_MONITOR = "demand-monitor"
PRICE_WATCHER = "price-watcher"
ALLOCATOR = "allocator"
SUPERVISOR = "supervisor"
ROUTER = "router"


def _bad_number(value: object, *, integer: bool = False, positive: bool = False) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, got {value!r}"
    if integer and not isinstance(value, int):
        return f"must be an integer, got {value!r}"
    if not math.isfinite(value):
        return f"must be finite, got {value!r}"
    if positive and not value > 0:
        return f"must be positive, got {value!r}"
    if value < 0:
        return f"must not be negative, got {value!r}"
    return None


def _bad_name(value: object) -> str | None:
    if not isinstance(value, str) or not value:
        return f"must be a non-empty name, got {value!r}"
    return None


class _Checked:
    """Static checks of a command's fields (names present, numbers in range); owners add name lookups."""

    def problems(self) -> tuple[str, str] | None:
        """(field, reason) of the first invalid field, or None."""
        return None


@message("ctl.demand")
@attrs.frozen
class SetDemand(_Checked):
    """Fix ``deployment``'s demand at ``rps`` req/s; ``None`` clears the override."""

    deployment: str
    rps: float | None = None
    ref: int = 0

    def problems(self) -> tuple[str, str] | None:
        if (r := _bad_name(self.deployment)) is not None:
            return ("deployment", r)
        if self.rps is not None and (r := _bad_number(self.rps)) is not None:
            return ("rps", r)
        return None


@message("ctl.availability")
@attrs.frozen
class SetAvailability(_Checked):
    """Fix how many nodes of ``node`` are obtainable in ``region``; ``None`` clears the override."""

    region: str
    node: str
    count: int | None = None
    ref: int = 0

    def problems(self) -> tuple[str, str] | None:
        for field in ("region", "node"):
            if (r := _bad_name(getattr(self, field))) is not None:
                return (field, r)
        if self.count is not None and (r := _bad_number(self.count, integer=True)) is not None:
            return ("count", r)
        return None


@message("ctl.price")
@attrs.frozen
class SetPrice(_Checked):
    """Fix the price (USD per node-hour) of ``node`` in ``region``; ``None`` clears the override."""

    region: str
    node: str
    price: float | None = None
    ref: int = 0

    def problems(self) -> tuple[str, str] | None:
        for field in ("region", "node"):
            if (r := _bad_name(getattr(self, field))) is not None:
                return (field, r)
        if self.price is not None and (r := _bad_number(self.price, positive=True)) is not None:
            return ("price", r)
        return None


@message("ctl.slo")
@attrs.frozen
class SetSlo(_Checked):
    """Change ``deployment``'s SLO: TTFT and TPOT targets (s) and the attainment target in (0, 1]."""

    deployment: str
    ttft_s: float
    tpot_s: float
    attainment: float = 0.9
    ref: int = 0

    def problems(self) -> tuple[str, str] | None:
        if (r := _bad_name(self.deployment)) is not None:
            return ("deployment", r)
        for field in ("ttft_s", "tpot_s", "attainment"):
            if (r := _bad_number(getattr(self, field), positive=True)) is not None:
                return (field, r)
        if self.attainment > 1:
            return ("attainment", f"must be at most 1, got {self.attainment!r}")
        return None


@message("ctl.forbid")
@attrs.frozen
class ForbidTemplate(_Checked):
    """Forbid a template (``forbid=False`` allows it again)."""

    template_id: str
    forbid: bool = True
    ref: int = 0

    def problems(self) -> tuple[str, str] | None:
        if (r := _bad_name(self.template_id)) is not None:
            return ("template_id", r)
        return None


@message("ctl.pin")
@attrs.frozen
class PinTemplate(_Checked):
    """Serve ``deployment`` only with the aggregated template ``template_id``; ``None`` unpins."""

    deployment: str
    template_id: str | None = None
    ref: int = 0

    def problems(self) -> tuple[str, str] | None:
        if (r := _bad_name(self.deployment)) is not None:
            return ("deployment", r)
        if self.template_id is not None and (r := _bad_name(self.template_id)) is not None:
            return ("template_id", r)
        return None


@message("ctl.drain")
@attrs.frozen
class DrainInstance(_Checked):
    """Drain and stop one instance (the next plan replaces its capacity)."""

    instance: str
    ref: int = 0

    def problems(self) -> tuple[str, str] | None:
        if (r := _bad_name(self.instance)) is not None:
            return ("instance", r)
        return None


@message("ctl.replan")
@attrs.frozen
class Replan(_Checked):
    """Re-plan now (the allocator applies it within a hop of its arrival)."""

    reason: str = "operator"
    ref: int = 0


@message("ctl.pause")
@attrs.frozen
class PauseAllocator(_Checked):
    """Pause the allocator (``paused=False`` resumes; a resume re-plans if anything changed meanwhile)."""

    paused: bool = True
    ref: int = 0


@message("ctl.churn")
@attrs.frozen
class SetChurn(_Checked):
    """Set the churn-penalty factor (0 disables the start-up penalty)."""

    factor: float
    ref: int = 0

    def problems(self) -> tuple[str, str] | None:
        if (r := _bad_number(self.factor)) is not None:
            return ("factor", r)
        return None


@message("ctl.speed")
@attrs.frozen
class SetSpeed(_Checked):
    """Run the mesh at ``speed`` kernel seconds per wall second from now on; ``None``: as fast as possible."""

    speed: float | None
    ref: int = 0

    def problems(self) -> tuple[str, str] | None:
        if self.speed is not None and (r := _bad_number(self.speed, positive=True)) is not None:
            return ("speed", r)
        return None


@message("ctl.result")
@attrs.frozen
class CommandResult:
    """The answer to a command: accepted (``ok``) or refused, with the field and the reason."""

    command: str
    ok: bool
    owner: str
    at: float
    field: str = ""
    reason: str = ""
    ref: int = 0


@message("ctl.alloc_state")
@attrs.frozen
class AllocatorState:
    """Published by the allocator at its first tick and whenever an operator setting of it changes:
    paused or not, the churn-penalty factor, pinned templates ((deployment, template id), sorted) and
    forbidden template ids (sorted)."""

    at: float
    paused: bool
    churn_factor: float
    pins: tuple[tuple[str, str], ...] = ()
    forbidden: tuple[str, ...] = ()


@message("ctl.snapshot_req")
@attrs.frozen
class SnapshotRequest:
    """Ask ``coral up``'s operator gateway for the latest state of the run (answered with a ``Snapshot``)."""


@attrs.frozen
class SnapshotRecord:
    """One published message as the gateway last saw it: its sender, tag and encoded body."""

    source: str
    tag: str
    body: bytes


@message("ctl.snapshot")
@attrs.frozen
class Snapshot:
    """The latest message of each state-carrying tag (run setup, allocator state, market, demand, fleet,
    traffic stats) and the most recent plans, oldest first, so that a client attaching to a running mesh
    shows it whole at once. Bodies stay encoded: decode each with ``coral.kernel.codec.decode``."""

    at: float
    records: tuple[SnapshotRecord, ...]


@message("slo.changed")
@attrs.frozen
class SloChanged:
    """Published by the allocator when it applies a new SLO, for the router's attainment accounting."""

    deployment: str
    ttft_s: float
    tpot_s: float
    attainment: float
    at: float


Command = (
    SetDemand
    | SetAvailability
    | SetPrice
    | SetSlo
    | ForbidTemplate
    | PinTemplate
    | DrainInstance
    | Replan
    | PauseAllocator
    | SetChurn
)

OWNERS: dict[type, str] = {
    SetDemand: DEMAND_MONITOR,
    SetAvailability: PRICE_WATCHER,
    SetPrice: PRICE_WATCHER,
    SetSlo: ALLOCATOR,
    ForbidTemplate: ALLOCATOR,
    PinTemplate: ALLOCATOR,
    DrainInstance: SUPERVISOR,
    Replan: ALLOCATOR,
    PauseAllocator: ALLOCATOR,
    SetChurn: ALLOCATOR,
}
COMMANDS: tuple[type, ...] = tuple(OWNERS)


def owner_of(cmd: object) -> str:
    """The name of the actor that owns a command's setting."""
    try:
        return OWNERS[type(cmd)]
    except KeyError:
        raise TypeError(f"{type(cmd).__name__} is not a control command") from None


def is_command(msg: object) -> bool:
    """Whether ``msg`` is one of the control commands."""
    return type(msg) in OWNERS
