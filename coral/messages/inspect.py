"""Inspection protocol: what a client (the TUI) asks the mesh instead of opening its files.

Requests and their replies, never published and never applied as commands (the ``inspect.`` tags are
not control tags, so a replay leaves them out):

=======================  ==============  =====================================================
request                  answered by     reply
=======================  ==============  =====================================================
``TemplatesRequest``     allocator       ``TemplatesReply``: templates by id or deployment, with
                                         their mode, nodes and capacity
``ScenarioRequest``      allocator       ``ScenarioInfo``: the run's deployments (model, SLO)
``PreviewRequest``       allocator       ``PlanPreview``: what the next plan would be after a
                                         pin, forbid or allow, without applying it
``ClockRequest``         operator        ``ClockInfo``: kernel time and how far it is behind the
                                         wall clock at the run's speed
=======================  ==============  =====================================================
"""

from __future__ import annotations

import attrs

from coral.kernel import message
from coral.plan import PlannedInstances
from coral.templates import Template

PREVIEW_ACTIONS = ("pin", "unpin", "forbid", "allow")
"""What ``PreviewRequest.action`` may be."""


@message("inspect.templates_req")
@attrs.frozen
class TemplatesRequest:
    """Ask for templates: those with the given ``ids``, and every template of ``deployment`` (if named)."""

    ids: tuple[str, ...] = ()
    deployment: str = ""


@attrs.frozen
class TemplateEntry:
    """A template as a deployment uses it: ``capacity_rps`` is the requests/s one instance serves at the
    deployment's mean prompt and output lengths; ``usable``: the allocator may plan it now (its SLO fits,
    it is not forbidden and the deployment is not pinned to another)."""

    deployment: str
    template: Template
    capacity_rps: float
    usable: bool


@message("inspect.templates")
@attrs.frozen
class TemplatesReply:
    """The templates asked for (unknown ids are listed in ``unknown``)."""

    entries: tuple[TemplateEntry, ...]
    unknown: tuple[str, ...] = ()


@message("inspect.scenario_req")
@attrs.frozen
class ScenarioRequest:
    """Ask for the run's scenario as the allocator applies it."""


@attrs.frozen
class DeploymentInfo:
    """One deployment: its model and the SLO in force (TTFT and TPOT targets in s, attainment)."""

    name: str
    model: str
    ttft_s: float
    tpot_s: float
    attainment: float


@message("inspect.scenario")
@attrs.frozen
class ScenarioInfo:
    """The scenario's name, regions, node types (with the GPU type of each) and deployments."""

    name: str
    regions: tuple[str, ...]
    node_types: tuple[str, ...]
    deployments: tuple[DeploymentInfo, ...]
    node_gpus: tuple[tuple[str, str], ...] = ()


@message("inspect.preview_req")
@attrs.frozen
class PreviewRequest:
    """What would the next plan be if ``deployment`` were pinned to ``template_id`` (``pin``), unpinned
    (``unpin``), or if ``template_id`` were forbidden (``forbid``) or allowed again (``allow``)?"""

    action: str
    template_id: str = ""
    deployment: str = ""

    def problems(self) -> tuple[str, str] | None:
        """(field, reason) of the first invalid field, or None."""
        if self.action not in PREVIEW_ACTIONS:
            return ("action", f"expected one of {', '.join(PREVIEW_ACTIONS)}, got {self.action!r}")
        if self.action in ("pin", "unpin") and not self.deployment:
            return ("deployment", "required")
        if self.action != "unpin" and not self.template_id:
            return ("template_id", "required")
        return None


@message("inspect.preview")
@attrs.frozen
class PlanPreview:
    """The answer to a ``PreviewRequest``: refused (``ok`` false, with the field and reason the command
    itself would get), or the plan the allocator would make now (not published, nothing applied),
    next to the latest published plan's figures."""

    ok: bool
    at: float
    field: str = ""
    reason: str = ""
    status: str = ""
    instances: int = 0
    cost_per_hour: float = 0.0
    unmet_rps: float = 0.0
    current_instances: int = 0
    current_cost_per_hour: float = 0.0
    current_unmet_rps: float = 0.0
    rows: tuple[PlannedInstances, ...] = ()


@message("inspect.clock_req")
@attrs.frozen
class ClockRequest:
    """Ask ``coral up``'s operator gateway where the kernel clock stands against the wall clock."""


@message("inspect.clock")
@attrs.frozen
class ClockInfo:
    """Kernel time ``at``; ``speed`` the run's pace (0: as fast as possible); ``behind_s`` how many kernel
    seconds the clock is behind where the wall clock and the speed say it should be (0 when not paced)."""

    at: float
    speed: float
    behind_s: float
