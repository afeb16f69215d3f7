"""Stage-worker engines: what runs a node's part of an instance.

A stage worker owns one engine. The protocol is small:

- ``load(stage, now) -> ready_at``: start loading a stage (the layers of one template stage) and say when
  it will be ready (``inf`` when only the engine can tell: a real server that must answer first);
- ``loaded(now)``: whether the stage is ready at ``now``;
- ``serve(now)``: every stage of the instance is loaded; take requests from ``now`` on;
- ``submit(items, now)``: hand requests to the instance (only the head node's engine takes requests);
- ``poll(now) -> outcomes``: what finished (``done``, ``failed``, ``handoff``) up to ``now``;
- ``metrics()``: counters and what is held now;
- ``drain(now) -> returned``: take no new work, hand back what has not started, finish the rest
  (``drained`` says when nothing is left);
- ``stop(now) -> abandoned``: drop everything at once;
- ``fault``: "" while the engine is sound, else why it is not (a real server that died): the worker reports
  it as a node fault.

An engine that serves HTTP itself (vLLM's OpenAI server) also has an ``endpoint`` attribute, its base URL;
the worker reports it with ``StageLoaded`` and the fleet publishes it, so that a gateway can reach it.
An engine that knows the tokens of requests still in flight has ``progress() -> {id: (tokens, t_first)}``
(the simulated one): the worker relays it so that the gateway streams simulated tokens as they come, and
wakes at the engine's ``next_event_at()`` (the engine time of its next event, None when idle) to do so.

``SimEngine`` (``coral.engines.sim``) runs the fleet simulator's timing model for one instance; ``VllmEngine``
(``coral.vllm.engine``) implements the same protocol over real vLLM processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs

from coral.errors import CoralError
from coral.messages.requests import Outcome, WorkItem
from coral.scenario import Deployment
from coral.templates import Template


@attrs.frozen
class StageAssignment:
    """One node's part of an instance: stage ``stage`` of ``template``, for ``deployment`` in ``region``.

    The ``head`` node's engine is the instance's front: it takes the requests and runs the whole
    pipeline's schedule; the other nodes' engines load their layers and report their health.
    ``warm`` skips the load time (the fleet that exists at the start of a run).
    """

    instance: str
    deployment: Deployment
    template: Template
    stage: int
    region: str
    head: bool
    warm: bool = False


@attrs.frozen
class EngineMetrics:
    """An engine's counters (since it loaded) and what it holds now."""

    in_flight: int = 0
    queued: int = 0
    completed: int = 0
    failed: int = 0
    preemptions: int = 0
    busy_s: float = 0.0


@runtime_checkable
class Engine(Protocol):
    """The stage-worker engine protocol (see the module docstring)."""

    def load(self, stage: StageAssignment, now: float) -> float: ...

    def loaded(self, now: float) -> bool: ...

    def serve(self, now: float) -> None: ...

    def submit(self, items: Sequence[WorkItem], now: float) -> None: ...

    def poll(self, now: float) -> list[Outcome]: ...

    def metrics(self) -> EngineMetrics: ...

    def drain(self, now: float) -> list[Outcome]: ...

    @property
    def drained(self) -> bool: ...

    def stop(self, now: float) -> int: ...

    @property
    def fault(self) -> str: ...


class EngineError(CoralError):
    """An engine used out of order (submit to a non-head node, a stage index outside the template, ...)."""


def check_load(loaded: StageAssignment | None, stage: StageAssignment) -> None:
    """What every engine's ``load`` checks first: nothing loaded yet, and a stage index of the template."""
    if loaded is not None:
        raise EngineError(f"engine: already loaded stage {loaded.stage} of {loaded.instance}")
    n = len(stage.template.stages)
    if not 0 <= stage.stage < n:
        raise EngineError(f"stage: template {stage.template.id} has {n} stages, got index {stage.stage}")


__all__ = ["Engine", "EngineError", "EngineMetrics", "StageAssignment", "check_load"]
