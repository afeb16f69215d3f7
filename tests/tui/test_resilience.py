"""The TUI survives the mesh going away and coming back, stays responsive in a flood of events, and never
leaves a command "pending" for good."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from coral.kernel import Actor, Envelope, Mesh, RequestError
from coral.messages import DeploymentTraffic, FleetAction, PauseAllocator, Replan, RoutingStats, is_command
from tui import model as M

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


class Silent(Actor):
    """An ``operator`` that takes every command and never answers (``received``: the control commands)."""

    def __init__(self) -> None:
        super().__init__("operator")
        self.received: list[Any] = []

    async def handle(self, env: Envelope) -> None:
        if is_command(env.msg):
            self.received.append(env.msg)


async def test_a_command_without_an_answer_fails_and_is_dropped_not_resent(tmp_path: Path) -> None:
    eps = endpoints(tmp_path)
    app = live_app(eps)  # the bus gives up on a request after 5 s
    app.command_timeout_s = 1.0  # the TUI's own bound comes first here
    async with app.run_test(size=(80, 24)) as pilot:
        async with Mesh(endpoints=eps, heartbeat_interval=0.2) as mesh:
            await until(pilot, lambda: app.state.link.state == "connected", "the TUI to connect")
            silent = Silent()
            await mesh.spawn(silent)
            app.send_command("replan", Replan())
            await until(pilot, lambda: bool(silent.received), "the command to reach the operator")
            assert app.state.commands[-1].status == "pending"
            await pilot.pause(0.05)
            assert "1 sent, awaiting answer" in str(app.query_one("#status").render())  # it fits 80 columns
            await until(pilot, lambda: app.state.commands[-1].status == "failed", "the command to time out")
            assert app.state.commands[-1].reason.startswith("no answer within 1 s; not resent")
            app.command_timeout_s = 60.0
            app.send_command("pause", PauseAllocator(True))
            await until(pilot, lambda: len(silent.received) == 2, "the second command to reach the operator")
        await until(pilot, lambda: app.state.link.state == "lost", "the TUI to notice the mesh is gone")
        await until(pilot, lambda: app.state.commands[-1].status == "failed", "the command in flight to fail")
        assert app.state.commands[-1].reason == M.LINK_LOST
        assert app.state.commands[-2].reason.startswith("no answer within 1 s"), "a settled command stays as it was"
        header = str(app.query_one("#status").render())
        assert "cmd waiting" not in header and "awaiting answer" not in header
        async with Mesh(endpoints=eps, heartbeat_interval=0.2) as mesh:
            again = Silent()
            await mesh.spawn(again)
            await until(pilot, lambda: app.state.link.state == "connected", "the TUI to reconnect")

            def dropped() -> list[str]:
                return [e.text for e in app.state.events if "dropped, not resent" in e.text]

            await until(pilot, lambda: bool(dropped()), "the dropped command")
            assert len(dropped()) == 1 and f"#{app.state.commands[-1].n} pause allocator" in dropped()[0]
            assert "re-plan" not in dropped()[0], "the timed-out command was reported when it timed out"
            await pilot.pause(0.5)
            assert again.received == [] and app.state.waiting_commands == 0


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

        def last_arrived() -> bool:  # the last report and the last action carry the same time: wait for both
            st = lv.app.state
            return st.now == 1000.0 + n and any(e.text.startswith(f"start x{n} ") for e in st.events)

        await until(lv.pilot, last_arrived, "the last report and the last action")
        st = lv.app.state
        assert lv.app.active_view == "events"
        assert st.deployments["chat-8b"].completed == n
        assert st.attainment == 1.0
        flood_events = [e for e in st.events if e.text.endswith(": flood")]
        assert len(flood_events) == n // 100, "events are never merged"
        assert flood_events[-1].t == 1000.0 + n
        assert lv.app.batches - batches0 < n // 10, "reports were merged into far fewer redraws"


async def test_its_own_inquiries_before_the_allocator_starts_are_not_mesh_errors(tmp_path: Path) -> None:
    eps = endpoints(tmp_path)
    app = live_app(eps)  # pings every 0.1 s, asking the absent allocator for the scenario each time
    async with Mesh(endpoints=eps) as mesh, app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.state.link.state == "connected", "the TUI to connect")
        await pilot.pause(0.5)
        other = await mesh.client("other")
        with pytest.raises(RequestError, match="unknown destination 'allocator'"):
            await other.request("allocator", Replan())
        await until(pilot, lambda: app.state.errors >= 1, "another peer's lost request")
        await pilot.pause(0.3)
        assert app.state.errors == 1
        assert [e.text for e in app.state.events if e.kind == "error"] == [
            "ctl.replan: unknown destination 'allocator' (from other)"
        ]
