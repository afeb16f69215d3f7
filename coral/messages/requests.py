"""Request protocol: arrivals into the router, work to the instances, outcomes back, and the router's reports.

- ``req.arrivals`` (``ArrivalBatch``): an external input, the requests arriving in ``[start, end)`` with
  their exact times and token counts. The input feed sends each batch a little ahead of its window so
  that the router can place the requests before they arrive.
- ``req.finish`` (``FinishTraffic``): an external input at the end of a run; the router fails what is
  still open as ``unfinished``.
- ``req.dispatch`` (``Dispatch``): router -> an instance's head worker: work items.
- ``req.done`` (``Completions``): head worker -> router: per request ``done``, ``failed`` (with a reason),
  ``handoff`` (a prefill instance finished the prompt: the router sends it on to a decode instance) or
  ``returned`` (a draining instance hands back a request it had not started).
- ``req.counts`` (``ArrivalCounts``): router -> demand monitor (published): arrivals per deployment.
- ``req.stats`` (``RoutingStats``): router totals per deployment, with latency quantiles.
- ``req.latency`` (``LatencySamples``): router (published, with each ``req.stats``): the TTFT and TPOT of
  every request completed since the previous report (for histograms; not a decision a replay compares).

From the HTTP gateway (``coral.gateway``), delivered at the mesh's quiet points like the input feed's:

- ``req.arrivals`` with ``reply=True``: its requests' progress and outcomes go back to the sender as
  ``req.result`` (``RequestResults``): ``progress`` (tokens generated so far, reported by the head worker
  as they grow; not for the requests in ``ends_only``: non-streamed ones), then ``done`` or ``failed``.
- ``req.proxied`` (``ProxiedArrivals``): requests the gateway sent straight to an instance's HTTP
  endpoint; the router only counts them as arrivals for the demand monitor.
- ``gw.refused`` (``ApiRefused``, published): requests its API-key check refused, merged per key name.
"""

from __future__ import annotations

import attrs

from coral.kernel import message

OUTCOME_KINDS = ("done", "failed", "handoff", "returned", "progress")
GATEWAY = "gateway"
"""The HTTP gateway's bus name (the sender of its arrivals)."""


@attrs.frozen
class RequestSpec:
    """One request: its id (unique in a run), deployment, arrival time and token counts."""

    id: int
    deployment: str
    t: float
    prompt: int
    out: int


@message("req.arrivals")
@attrs.frozen
class ArrivalBatch:
    """Requests arriving in ``[start, end)`` (an external input). ``resubmitted``: requests that were
    open when the kernel crashed, handed again to the router of the resumed run (their demand was already
    counted before the crash, so the router does not count it again); ``reply``: report their progress and
    outcomes to the sender (``req.result``), but only the outcome for the requests in ``ends_only`` (a
    client that waits for the whole answer, not a stream)."""

    start: float
    end: float
    requests: tuple[RequestSpec, ...]
    resubmitted: bool = False
    reply: bool = False
    ends_only: tuple[int, ...] = ()


@message("req.finish")
@attrs.frozen
class FinishTraffic:
    """The end of a run (an external input): fail every request still open."""

    at: float
    reason: str = "end of run"


@attrs.frozen
class WorkItem:
    """A request handed to an instance. ``avail`` is the earliest time it may enter the engine; ``attempt``
    counts retries; a KV handoff to a decode instance has ``gen`` tokens already made, its first token at
    ``first_t`` and ``kv_nic`` > 0 (bytes/s of the prefill instance's slowest NIC). ``progress``: the head
    worker reports the tokens generated so far as they grow (``progress`` outcomes)."""

    id: int
    deployment: str
    t_arr: float
    avail: float
    prompt: int
    out: int
    attempt: int = 0
    gen: int = 0
    first_t: float = -1.0
    kv_nic: float = 0.0
    progress: bool = False


@message("req.dispatch")
@attrs.frozen
class Dispatch:
    """Work for one instance (sent to its head worker)."""

    instance: str
    items: tuple[WorkItem, ...]


@attrs.frozen
class Outcome:
    """What happened to a request on an instance: ``kind`` in OUTCOME_KINDS at time ``t``;
    ``t_first`` is its first token's time (-1 if none); ``tokens``: output tokens generated so far
    (``progress``, and ``handoff`` from an engine that counts them)."""

    id: int
    kind: str
    t: float
    t_first: float = -1.0
    reason: str = ""
    tokens: int = 0


@message("req.done")
@attrs.frozen
class Completions:
    """Outcomes from one instance since its previous report, and the router's requests it holds but has
    not started at ``at`` (``waiting``; -1: its engine does not say)."""

    instance: str
    at: float
    outcomes: tuple[Outcome, ...]
    waiting: int = -1


@message("req.counts")
@attrs.frozen
class ArrivalCounts:
    """Arrivals per deployment with arrival time in ``[since, at)``."""

    at: float
    since: float
    counts: dict[str, int]


@attrs.frozen
class DeploymentTraffic:
    """Totals for one deployment since the start, plus the attainment of the last report window.

    ``slo_met`` counts completions that met both the TTFT and the TPOT target; latency quantiles are in
    seconds over every completion so far. ``window_attainment`` is -1 when nothing finished in the window.
    """

    deployment: str
    arrivals: int
    dispatched: int
    completed: int
    failed: int
    failed_by: dict[str, int]
    retries: int
    in_flight: int
    queued: int
    slo_met: int
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    e2e_p50: float
    window_attainment: float

    @property
    def attainment(self) -> float:
        """Fraction of finished requests (completed or failed) that met both targets; 1 when none."""
        done = self.completed + self.failed
        return self.slo_met / done if done else 1.0


@message("req.stats")
@attrs.frozen
class RoutingStats:
    """The router's totals per deployment."""

    seq: int
    at: float
    deployments: tuple[DeploymentTraffic, ...]
    final: bool = False


@message("req.latency")
@attrs.frozen
class LatencySamples:
    """Per deployment, the TTFT and TPOT (seconds) of the requests completed in ``[since, at)``; a
    single-token request has no TPOT."""

    at: float
    since: float
    ttft: dict[str, tuple[float, ...]]
    tpot: dict[str, tuple[float, ...]]


@message("req.result")
@attrs.frozen
class RequestResults:
    """Router -> the sender of a ``reply`` arrival batch: progress and outcomes of its requests."""

    at: float
    outcomes: tuple[Outcome, ...]


@message("req.proxied")
@attrs.frozen
class ProxiedArrivals:
    """Gateway -> router: requests per deployment sent straight to instance endpoints, arrived by ``at``."""

    at: float
    counts: dict[str, int]


@message("gw.refused")
@attrs.frozen
class ApiRefused:
    """Gateway -> everyone: requests refused by the API-key check (``coral.gateway.auth``), merged per key
    and status: ``count`` refusals of key ``key`` (its name, never the key; ``(none)`` or ``(unknown)``)
    with HTTP status ``status`` (401, 403, 429) over the last ``window_s`` seconds (0: the first one)."""

    key: str
    status: int
    count: int
    window_s: float
