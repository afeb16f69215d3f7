"""Test-only message types (tags under ``test.kernel.``) and small helpers shared by the kernel tests."""

from __future__ import annotations

import enum

import anyio
import attrs

from coral.kernel import BusClient, Envelope, message


class Mode(enum.Enum):
    AGGREGATED = "aggregated"
    PREFILL = "prefill"
    DECODE = "decode"


@attrs.frozen
class Stage:
    node: str
    layers: tuple[int, int]
    tp: int = 1


@message("test.kernel.plan")
@attrs.frozen
class Plan:
    """Nested attrs, tuples, dicts, an enum and optional fields."""

    plan_id: int
    mode: Mode
    stages: tuple[Stage, ...]
    cost_per_h: dict[str, float]
    gap: float | None = None
    note: str | None = None
    tags: tuple[str, ...] = ()


@message("test.kernel.ping")
@attrs.frozen
class Ping:
    n: int


@message("test.kernel.pong")
@attrs.frozen
class Pong:
    n: int


@message("test.kernel.a.event")
@attrs.frozen
class AEvent:
    n: int


@message("test.kernel.b.event")
@attrs.frozen
class BEvent:
    n: int


@message("test.kernel.blob")
@attrs.frozen
class Blob:
    data: bytes
    seq: int = 0


@message("test.kernel.tick")
@attrs.frozen
class Tick:
    actor: str
    time: float


async def next_of(bus: BusClient, cls: type, timeout: float = 10.0) -> Envelope:
    """The next envelope carrying a ``cls`` message (others are skipped)."""
    with anyio.fail_after(timeout):
        while True:
            env = await bus.receive()
            if isinstance(env.msg, cls):
                return env


async def next_match(bus: BusClient, cls: type, timeout: float = 10.0, **fields: object) -> Envelope:
    """The next envelope carrying a ``cls`` message whose attributes equal ``fields``."""
    with anyio.fail_after(timeout):
        while True:
            env = await next_of(bus, cls)
            if all(getattr(env.msg, k) == v for k, v in fields.items()):
                return env


def drain(bus: BusClient) -> list[Envelope]:
    """Everything already in the client's inbox, without waiting."""
    out: list[Envelope] = []
    while bus.backlog:
        out.append(bus.receive_nowait())
    return out
