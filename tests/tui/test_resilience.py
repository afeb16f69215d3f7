"""The TUI survives the mesh going away and coming back, and stays responsive in a flood of events."""

from __future__ import annotations

from pathlib import Path

from coral.kernel import Mesh
from coral.messages import DeploymentTraffic, FleetAction, Replan, RoutingStats

from .fake import FakeCoral
from .helpers import endpoints, live, live_app, until


async def test_survives_the_mesh_stopping_and_restarting(tmp_path: Path) -> None:
    eps = endpoints(tmp_path)
    app = live_app(eps)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.state.link.state == "lost", "the TUI to find no mesh")
        async with Mesh(endpoints=eps, heartbeat_interval=0.2) as mesh:
            await until(pilot, lambda: app.state.link.state == "connected", "the TUI to connect")
            await mesh.spawn(FakeCoral())
            await until(pilot, lambda: len(app.state.plans) == 1 and bool(app.state.instances), "the first plan")
        await until(pilot, lambda: app.state.link.state == "lost", "the TUI to notice the mesh is gone")
        kept = app.state
        assert kept.plans and kept.instances and kept.market, "the last state stays on screen"
        header = str(app.query_one("#status").render())
        assert "mesh lost" in header
        assert any("mesh shutting down" in e.text for e in kept.events)
        app.send_command("replan", Replan())
        await until(pilot, lambda: app.state.commands[-1].status == "failed", "the command to be refused")
        assert "not connected" in app.state.commands[-1].reason
        async with Mesh(endpoints=eps, heartbeat_interval=0.2) as mesh:
            await until(pilot, lambda: app.state.link.state == "connected", "the TUI to reconnect")
            fake = FakeCoral()
            await mesh.spawn(fake)
            await until(pilot, lambda: app.state.plan_count == 2, "the plan of the new mesh")
            assert len(app.state.plans) == 1, "a new run starts a new plan history"
            await pilot.press("r", "y")
            await until(pilot, lambda: app.state.plan_count == 3, "the re-plan after reconnecting")
            assert fake.received == [Replan("operator")]
            assert "● live" in str(app.query_one("#status").render())


def _stats(seq: int) -> RoutingStats:
    t = DeploymentTraffic("chat-8b", seq, seq, seq, 0, {}, 0, 0, 0, seq, 0.1, 0.2, 0.01, 0.02, 1.0, 1.0)
    return RoutingStats(seq, 1000.0 + seq, (t,))


async def test_a_flood_is_merged_and_the_ui_keeps_up(tmp_path: Path) -> None:
    async with live(tmp_path) as lv:
        spam = await lv.mesh.client("spam")
        n = 3000
        batches0 = lv.app.batches
        for k in range(1, n + 1):
            await spam.publish(_stats(k))
            if k % 100 == 0:
                await spam.publish(FleetAction(1000.0 + k, "start", f"x{k}", "chat-8b", "t", "r", "flood"))
            if k == n // 2:
                await lv.pilot.press("5")  # the keyboard works mid-flood
        await until(lv.pilot, lambda: lv.app.state.now == 1000.0 + n, "the last report")
        st = lv.app.state
        assert lv.app.active_view == "events"
        assert st.deployments["chat-8b"].completed == n
        assert st.attainment == 1.0
        flood_events = [e for e in st.events if e.text.endswith(": flood")]
        assert len(flood_events) == n // 100, "events are never merged"
        assert flood_events[-1].t == 1000.0 + n
        assert lv.app.batches - batches0 < n // 10, "reports were merged into far fewer redraws"
