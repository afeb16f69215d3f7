"""Protocol messages: every type round-trips through the wire codec; commands check their fields."""

from __future__ import annotations

import math
from typing import Any

import attrs
import pytest

import coral.messages as m
from coral.kernel import REGISTRY, decode, encode
from coral.messages import hosts
from coral.plan import DeploymentServing, Plan, PlannedInstances

PLAN = Plan(
    3, 12.0, "coral", "demand", (PlannedInstances("chat", "t1", "r1", 2, ("a", "b"), "aggregated", 3.5, 1.25),),
    (DeploymentServing("chat", "llama", 2.0, 2.5, 0.0),), 7.0, 0.1, "optimal", 0.0, 7.0, 0.02, {"cost": 17},
)  # fmt: skip
INFO = m.InstanceInfo("i1", "chat", "t1", "r1", "aggregated", "serving", ("a",), ("n1",), "worker-n1", 2.0, 1e9, 0.0)
SAMPLES: list[object] = [
    m.MarketQuotes(0.0, "scenario", (m.Quote("r1", "a", 1.5, 4),)),
    m.MarketUpdate(1, 1.0, (m.Quote("r1", "a", 1.5, 4),), (m.Quote("r1", "a", 1.5, 4),), ("r1/a",), "operator"),
    m.DemandUpdate(2, 3.0, {"chat": 1.5}, {"chat": 1.2}, ("chat",), "operator"),
    m.NewPlan(PLAN, (m.PlanChange("chat", "t1", "r1", 2),), m.PlanInputs(1, 2, 3)),
    m.PlanAnswer(3),
    m.FleetUpdate(4, 5.0, (INFO,), ("i0",), (), ("i9",), (m.PendingStart("chat", "t1", "r1", 1),), 3.5, 0.25, "plan"),
    m.FleetAction(1.0, "start", "i1", "chat", "t1", "r1", "plan 1"),
    m.NodeLost(2.0, "n1", "r1", "a", "i1", "heartbeat"),
    m.CapacityShort(3.0, "chat", 2.0, 1.5, True, "nodes lost"),
    m.FaultInjected(3.0, "node_loss", "r1", "a", 2),
    m.WorkerHeartbeat("n1", 1.0, "serving", 3),
    m.LoadStage("i1", "chat", "t1", 0, "r1", True, False),
    m.StageLoaded("n1", "i1", 2.0),
    m.ServeInstance("i1"),
    m.DrainOrder("i1", "plan 2"),
    m.InstanceDrained("i1", "n1", 4.0),
    m.EngineFault("n1", "i1", 4.5, "the vLLM server (pid 7) exited (killed by signal 9)"),
    m.EngineStats("n1", "i1", 5.0, 3, 1, 0.25, 1200.0, 800.0, 0),
    m.ReleaseNode("n1", "drained"),
    m.KillNode("n1", "node_loss"),
    m.ApiRefused("alice", 429, 3, 1.0),
    m.ArrivalBatch(0.0, 1.0, (m.RequestSpec(1, "chat", 0.5, 100, 20),)),
    m.FinishTraffic(9.0),
    m.Dispatch("i1", (m.WorkItem(1, "chat", 0.5, 0.5, 100, 20, 1, 1, 0.7, 1e9),)),
    m.Completions("i1", 2.0, (m.Outcome(1, "done", 1.9, 0.7), m.Outcome(2, "failed", 1.0, -1.0, "too_long"))),
    m.ArrivalCounts(5.0, 0.0, {"chat": 4}),
    m.ArrivalBatch(2.0, 2.0, (m.RequestSpec(1 << 48, "chat", 2.0, 10, 4),), reply=True),
    m.RequestResults(3.0, (m.Outcome(1 << 48, "progress", 3.0, 2.5, tokens=2),)),
    m.ProxiedArrivals(3.0, {"chat": 2}),
    m.LatencySamples(5.0, 0.0, {"chat": (0.1, 0.2)}, {"chat": (0.01,)}),
    m.RoutingStats(
        1, 5.0, (m.DeploymentTraffic("chat", 4, 4, 2, 1, {"x": 1}, 0, 1, 0, 2, 0.1, 0.2, 0.01, 0.02, 1.0, 0.5),)
    ),
    m.SetDemand("chat", 2.0),
    m.SetDemand("chat"),
    m.SetAvailability("r1", "a", 3),
    m.SetPrice("r1", "a", 2.5),
    m.SetSlo("chat", 1.0, 0.05, 0.95),
    m.ForbidTemplate("t1", False),
    m.PinTemplate("chat", "t1"),
    m.DrainInstance("i1"),
    m.Replan(),
    m.PauseAllocator(False),
    m.SetChurn(0.5),
    m.SetSpeed(20.0),
    m.SetSpeed(None),
    m.CommandResult("ctl.price", False, "price-watcher", 1.0, "price", "must be positive", -3),
    m.SloChanged("chat", 1.0, 0.05, 0.95, 2.0),
    m.AllocatorState(3.0, True, 0.5, (("chat", "t1"),), ("t2", "t3")),
    m.SnapshotRequest(),
    m.TemplatesRequest(("t1",), "chat"),
    m.TemplatesReply((), ("t9",)),
    m.ScenarioRequest(),
    m.ScenarioInfo("s", ("r1",), ("a",), (m.DeploymentInfo("chat", "llama", 1.0, 0.05, 0.9),), (("a", "l4"),)),
    m.PreviewRequest("pin", "t1", "chat"),
    m.PlanPreview(True, 3.0, status="optimal", instances=2, cost_per_hour=1.5, current_instances=1),
    m.ClockRequest(),
    m.ClockInfo(5.0, 10.0, 12.5),
    m.Snapshot(4.0, (m.SnapshotRecord("allocator", "ctl.alloc_state", b"\x91\x01"),)),
    m.MeshEnd(10.0, "stopped"),
    m.MeshResumed(40.0, 150, ("i1",), ("n2",), ("n3",), 20, 281),
    hosts.WorkerHello("h1", "r1", "a", 8, "127.0.0.2", "x1", (hosts.RunningServer("k1", "i1", 0, 7, 8001, 29500),)),
    hosts.WorkerWelcome("h1", False, "node type 'zz' is not in the catalog"),
    hosts.StartServer("k1", "i1", "llama", 0, ("--port", "8001"), (("VLLM_CPU_KVCACHE_SPACE", "1"),), 1),
    hosts.ServerStarted("h1", "k1", True, 7, 8001, 29500),
    hosts.StopServer("k1", "drained"),
    hosts.ServerExited("h1", "k1", -9, "killed"),
    hosts.HostBeat("h1", ()),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda x: type(x).__name__)
def test_every_message_round_trips(msg: object) -> None:
    tag, body = encode(msg)
    families = ("mkt", "dem", "plan", "fleet", "req", "ctl", "slo", "mesh", "inspect", "gw", "host")
    assert tag.decode().split(".")[0] in families
    assert decode(tag, body) == msg


def test_every_protocol_class_is_sampled() -> None:
    classes = {
        REGISTRY.cls_of(t) for t in REGISTRY.tags() if REGISTRY.cls_of(t).__module__.startswith("coral.messages")
    }
    sampled = {type(x) for x in SAMPLES} | {m.MeshSetup}
    assert classes <= sampled, classes - sampled


@pytest.mark.parametrize(
    ("cmd", "field", "needle"),
    [
        (m.SetDemand("chat", -1.0), "rps", "negative"),
        (m.SetDemand("", 1.0), "deployment", "non-empty"),
        (m.SetDemand("chat", math.nan), "rps", "finite"),
        (m.SetAvailability("r1", "a", -2), "count", "negative"),
        (m.SetAvailability("r1", "a", 1.5), "count", "integer"),  # type: ignore[arg-type]
        (m.SetPrice("r1", "a", 0.0), "price", "positive"),
        (m.SetPrice("r1", "", 1.0), "node", "non-empty"),
        (m.SetSlo("chat", 1.0, -0.1), "tpot_s", "positive"),
        (m.SetSlo("chat", 1.0, 0.1, 1.5), "attainment", "at most 1"),
        (m.SetChurn(-0.5), "factor", "negative"),
        (m.PinTemplate("chat", ""), "template_id", "non-empty"),
        (m.DrainInstance(""), "instance", "non-empty"),
        (m.SetSpeed(0.0), "speed", "positive"),
        (m.SetSpeed(math.inf), "speed", "finite"),
    ],
)
def test_commands_name_the_bad_field(cmd: m.SetDemand, field: str, needle: str) -> None:
    bad = cmd.problems()
    assert bad is not None and bad[0] == field and needle in bad[1]


def test_valid_commands_have_no_problems_and_an_owner() -> None:
    for cmd in [x for x in SAMPLES if m.is_command(x)]:
        assert cmd.problems() is None, cmd  # type: ignore[attr-defined]
        assert m.owner_of(cmd) in ("demand-monitor", "price-watcher", "allocator", "supervisor")
    with pytest.raises(TypeError, match="not a control command"):
        m.owner_of(m.MeshEnd(0.0, "x"))


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"tick_s": 0.1}, "tick_s"),
        ({"heartbeat_timeout_s": 5.0}, "heartbeat_timeout_s"),
        ({"report_s": 0.5}, "report_s"),
        ({"lookahead_ticks": 1}, "lookahead_ticks"),
        ({"warmup_s": 2.0}, "warmup_s"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_queue": 0}, "max_queue"),
        ({"instance_queue_s": 0.5}, "instance_queue_s"),
    ],
)
def test_timing_checks_name_the_field(change: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        attrs.evolve(m.MeshTiming(), **change).check()


def test_cloud_and_demand_setup_checks() -> None:
    with pytest.raises(ValueError, match=r"cloud\.kind"):
        m.CloudSetup(kind="aws").check()
    with pytest.raises(ValueError, match="at least one host"):
        m.CloudSetup(kind="hosts").check()
    with pytest.raises(ValueError, match="unique"):
        m.CloudSetup(kind="hosts", hosts=(m.Host("a", "r", "n"), m.Host("a", "r", "n"))).check()
    with pytest.raises(ValueError, match="peak_s"):
        m.DemandTuning(avg_s=30.0, peak_s=10.0).check()
    assert m.MeshTiming().check().ticks(5.0) == 5
