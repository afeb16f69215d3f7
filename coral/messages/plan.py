"""Plan protocol: the allocator publishes each new plan with its diff against the previous one.

``NewPlan.plan`` is a ``coral.plan.Plan``; its ``effort`` records where the solver stopped so that a
replay re-solves with exactly that effort. ``diff`` lists instance counts to start (positive) or stop
(negative) per (deployment, template, region). ``inputs`` names the sequence numbers of the demand,
market and fleet updates the plan was solved from (0: none yet).

``PlanAnswer`` is an external input of a live run: the solver's answer to plan ``seq`` reached the mesh
at the kernel time it is delivered (sent by ``SOLVER``, journaled, and fed again by a replay); the
allocator publishes that plan then, or at its start + the deadline if that is later (``actors.allocator``).
"""

from __future__ import annotations

import attrs

from coral.kernel import message
from coral.plan import Plan


@attrs.frozen
class PlanChange:
    """A change of the instance count of one (deployment, template, region)."""

    deployment: str
    template_id: str
    region: str
    delta: int


@attrs.frozen
class PlanInputs:
    """Which updates a plan saw: sequence numbers of the last demand, market and fleet update."""

    demand_seq: int = 0
    market_seq: int = 0
    fleet_seq: int = 0


SOLVER = "solver"
"""The sender of ``PlanAnswer`` inputs (the run's driver, on the solver process's behalf)."""


@message("plan.answer")
@attrs.frozen
class PlanAnswer:
    """The solver's answer to plan ``seq`` reached the mesh (see the module docstring)."""

    seq: int


@message("plan.new")
@attrs.frozen
class NewPlan:
    """A solved plan, its diff against the previous plan, and the inputs it was solved from."""

    plan: Plan
    diff: tuple[PlanChange, ...]
    inputs: PlanInputs = PlanInputs()

    @property
    def starts(self) -> int:
        return sum(c.delta for c in self.diff if c.delta > 0)

    @property
    def stops(self) -> int:
        return -sum(c.delta for c in self.diff if c.delta < 0)
