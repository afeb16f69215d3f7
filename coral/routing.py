"""Seeded routing draws: a call-order-free uniform number, the weighted pick it drives, which decode
instances may take a prefill instance's KV cache, and how many requests an instance is given at once.

The router actor, the gateway and the simulator route the same way, so they take these from here: a
request's instance depends only on the seed, the request's keys and the instances' weights.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from coral.messages.fleet import InstanceInfo

T = TypeVar("T")

_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def uniform(seed: int, *keys: int) -> float:
    """A uniform number in [0, 1) determined by ``seed`` and ``keys`` (splitmix64), independent of call order."""
    h = _mix(seed & _MASK)
    for k in keys:
        h = _mix(h ^ (k & _MASK))
    return (h >> 11) * (1.0 / (1 << 53))


def pick(instances: Sequence[InstanceInfo], u: float) -> InstanceInfo:
    """The instance whose share of the total weight holds ``u`` in [0, 1)."""
    cum = list(itertools.accumulate(i.weight for i in instances))
    return instances[min(bisect.bisect_right(cum, u * cum[-1]), len(instances) - 1)]


def kv_compatible(decoders: Sequence[T], sender_nic: float, need: Callable[[T], float]) -> list[T]:
    """The decode instances whose template holds its TPOT behind a sender of NIC ``sender_nic`` (bytes/s):
    those with ``need(i)`` (the template's ``kv_min_nic``) at most ``sender_nic``, as the allocation pairs
    them (``solvers.allocation.columns``) and the simulator hands off (``coral.sim.batching``)."""
    return [i for i in decoders if need(i) <= sender_nic * (1.0 + 1e-12)]


def instance_bound(weight: float, mode: str, ttft_s: float, decode_s: float, queue_s: float) -> int:
    """The most requests an instance of capacity ``weight`` (req/s) is given at once: ``weight × (service +
    queue_s)``, where service is the SLO's time for one request in its ``mode`` (``ttft_s`` for prefill,
    ``decode_s`` (mean output x TPOT) for decode, their sum aggregated); at least 1."""
    service = ttft_s if mode == "prefill" else decode_s if mode == "decode" else ttft_s + decode_s
    return max(1, math.ceil(weight * (service + queue_s)))
