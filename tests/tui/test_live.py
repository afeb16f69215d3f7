"""Pilot tests: every steering action against a live (fake) mesh, from the key to the plan on screen.

Each test presses keys as an operator would, checks the typed control message on the bus (the kernel's
journal and what the fake received) and the change it caused, as the TUI shows it.
"""

from __future__ import annotations

from pathlib import Path

from textual.widgets import DataTable

from coral.kernel import read_journal
from coral.messages import (
    DrainInstance,
    ForbidTemplate,
    PauseAllocator,
    PinTemplate,
    Replan,
    SetAvailability,
    SetChurn,
    SetDemand,
    SetPrice,
    SetSlo,
)
from tui.screens.confirm import ConfirmScreen
from tui.screens.form import CommandForm
from tui.screens.plan import PlanScreen

from .helpers import Live, live, until


async def submit(lv: Live, keys: str, *, clear: str | None = None, key: str = "enter", confirm: bool = False) -> int:
    """Type into the open form (after emptying field ``clear``), submit with ``key`` (and, with ``confirm``,
    say yes to the preview once the allocator's answer is on screen), and return the command's number."""
    pilot = lv.pilot
    await until(pilot, lambda: isinstance(lv.app.screen, CommandForm), "the form")
    if clear is not None:
        field = lv.app.screen.query_one(f"#field-{clear}")
        field.value = ""  # type: ignore[attr-defined]
        field.focus()
    if keys:
        await pilot.press(*keys)
    before = lv.app.state.command_count
    await pilot.press(key)
    if confirm:
        await until(pilot, lambda: isinstance(lv.app.screen, ConfirmScreen), "the confirmation")
        screen = lv.app.screen
        assert isinstance(screen, ConfirmScreen)
        await until(pilot, lambda: screen.answer is not None, "the allocator's preview")
        await pilot.press("y")
    await until(pilot, lambda: lv.app.state.command_count > before, "the command to be sent")
    n = lv.app.state.command_count
    await lv.wait_result(n)
    return n


async def select_row(lv: Live, table_id: str, key: str) -> None:
    table = lv.app.screen.query_one(f"#{table_id}", DataTable)
    index = table.get_row_index(key)
    table.move_cursor(row=index)
    table.focus()
    await lv.pilot.pause()


def status(lv: Live, n: int) -> str:
    return next(c.status for c in lv.app.state.commands if c.n == n)


async def test_override_and_clear_demand(tmp_path: Path) -> None:
    async with live(tmp_path) as lv:
        await lv.pilot.press("2")
        await select_row(lv, "models-table", "chat-8b")
        seq = lv.last_plan_seq()
        await lv.pilot.press("d")
        n = await submit(lv, "12")
        assert status(lv, n) == "ok"
        assert lv.fake.received[-1] == SetDemand("chat-8b", 12.0)
        assert lv.sent_on_bus("ctl.demand")[-1] == SetDemand("chat-8b", 12.0)
        await lv.wait_plan(seq)
        st = lv.app.state
        assert st.plans[-1].trigger == "demand"
        assert st.deployments["chat-8b"].demand == 12.0 and st.deployments["chat-8b"].override
        assert st.deployments["chat-8b"].planned_capacity >= 12.0
        cell = lv.app.query_one("#models-table", DataTable).get_row("chat-8b")[1]
        assert str(cell) == "12.00⚑"
        seq = lv.last_plan_seq()
        await lv.pilot.press("d")
        n = await submit(lv, "", key="ctrl+u")  # the form's Clear: a blank field would be refused
        assert lv.fake.received[-1] == SetDemand("chat-8b", None)
        await lv.wait_plan(seq)
        assert not lv.app.state.deployments["chat-8b"].override


async def test_stockout_and_price(tmp_path: Path) -> None:
    async with live(tmp_path) as lv:
        await lv.pilot.press("3")
        used = {(i.region, n) for i in lv.app.state.instances.values() for n in i.node_types}
        assert ("aws-us-east-1", "g6.xlarge") in used
        await select_row(lv, "market-table", "aws-us-east-1/g6.xlarge")
        seq = lv.last_plan_seq()
        await lv.pilot.press("a")
        await submit(lv, "0")
        assert lv.fake.received[-1] == SetAvailability("aws-us-east-1", "g6.xlarge", 0)
        assert lv.sent_on_bus("ctl.availability")[-1] == SetAvailability("aws-us-east-1", "g6.xlarge", 0)
        await lv.wait_plan(seq)
        st = lv.app.state
        assert st.plans[-1].trigger == "market"
        assert st.market[("aws-us-east-1", "g6.xlarge")].stockout
        assert st.market[("aws-us-east-1", "g6.xlarge")].overridden
        assert all("g6.xlarge" not in r.nodes or r.region != "aws-us-east-1" for r in st.plans[-1].instances)
        row = lv.app.query_one("#market-table", DataTable).get_row("aws-us-east-1/g6.xlarge")
        assert "STOCKOUT" in str(row[4])
        assert "▼ 16→0" in str(row[6])
        cost = st.plans[-1].cost_per_hour
        seq = lv.last_plan_seq()
        await select_row(lv, "market-table", "gcp-us-central1/a2-highgpu-1g")
        await lv.pilot.press("dollar_sign")
        await submit(lv, "0.5")
        assert lv.fake.received[-1] == SetPrice("gcp-us-central1", "a2-highgpu-1g", 0.5)
        await lv.wait_plan(seq)
        assert lv.app.state.market[("gcp-us-central1", "a2-highgpu-1g")].price == 0.5
        assert lv.app.state.plans[-1].cost_per_hour < cost


async def test_slo_change_accepted_then_refused(tmp_path: Path) -> None:
    async with live(tmp_path) as lv:
        await lv.pilot.press("2")
        await select_row(lv, "models-table", "code-14b")
        seq = lv.last_plan_seq()
        await lv.pilot.press("o")
        await until(lv.pilot, lambda: isinstance(lv.app.screen, CommandForm), "the SLO form")
        assert lv.app.screen.query_one("#field-ttft_s").value == "1"  # type: ignore[attr-defined]
        n = await submit(lv, "1.5", clear="ttft_s")
        assert status(lv, n) == "ok"
        assert lv.fake.received[-1] == SetSlo("code-14b", 1.5, 0.05, 0.9)
        await lv.wait_plan(seq)
        assert lv.app.state.plans[-1].trigger == "slo"
        slo = lv.app.state.deployments["code-14b"].slo
        assert slo is not None and slo.ttft_s == 1.5
        await lv.pilot.press("o")
        n = await submit(lv, "0.2", clear="ttft_s")
        assert status(lv, n) == "refused"
        cmd = next(c for c in lv.app.state.commands if c.n == n)
        assert cmd.field == "ttft_s" and "no template meets" in cmd.reason
        assert any("refused ctl.slo" in e.text for e in lv.app.state.events)


async def test_forbid_and_pin_from_the_plan_screen(tmp_path: Path) -> None:
    async with live(tmp_path) as lv:
        await lv.pilot.press("4")
        await lv.pilot.press("enter")
        await until(lv.pilot, lambda: isinstance(lv.app.screen, PlanScreen), "the plan screen")
        plan = lv.app.state.plans[-1]
        row = next(i for i, r in enumerate(plan.instances) if r.deployment == "chat-8b")
        tid = plan.instances[row].template_id
        await select_row(lv, "plan-instances", str(row))
        seq = lv.last_plan_seq()
        await lv.pilot.press("f")
        await submit(lv, "", confirm=True)
        assert lv.fake.received[-1] == ForbidTemplate(tid, True)
        assert lv.sent_on_bus("ctl.forbid")[-1] == ForbidTemplate(tid, True)
        await lv.wait_plan(seq)
        assert tid in lv.app.state.forbidden
        assert all(r.template_id != tid for r in lv.app.state.plans[-1].instances)
        # pin chat-8b to the forbidden one's sibling, typing only a prefix of its id
        other = next(t for t in ("a1c8e3f0b2d4e6f8a0b2c4d6", "b7d2c1e9f3a5b7c9d1e3f5a7") if t != tid)
        await lv.pilot.press("escape")
        await lv.pilot.press("2")
        await select_row(lv, "models-table", "chat-8b")
        seq = lv.last_plan_seq()
        await lv.pilot.press("n")
        await submit(lv, other[:6], confirm=True)
        assert lv.fake.received[-1] == PinTemplate("chat-8b", other)
        await lv.wait_plan(seq)
        assert {r.template_id for r in lv.app.state.plans[-1].instances if r.deployment == "chat-8b"} == {other}
        assert lv.app.state.deployments["chat-8b"].pinned == other


async def test_drain_instance(tmp_path: Path) -> None:
    async with live(tmp_path) as lv:
        await lv.pilot.press("1")
        inst = sorted(lv.app.state.instances)[0]
        await select_row(lv, "fleet-instances", inst)
        seq = lv.last_plan_seq()
        await lv.pilot.press("x")
        await submit(lv, "")
        assert lv.fake.received[-1] == DrainInstance(inst)
        assert lv.sent_on_bus("ctl.drain")[-1] == DrainInstance(inst)
        await lv.wait_plan(seq)
        assert lv.app.state.instances[inst].state == "draining"
        assert lv.app.state.plans[-1].trigger == "fleet"
        assert "draining" in str(lv.app.query_one("#fleet-instances", DataTable).get_row(inst)[2])


async def test_replan_pause_resume_and_churn(tmp_path: Path) -> None:
    async with live(tmp_path) as lv:
        seq = lv.last_plan_seq()
        await lv.pilot.press("r")
        await lv.pilot.press("y")
        await lv.wait_plan(seq, "the re-plan")
        assert lv.fake.received[-1] == Replan("operator")
        assert lv.sent_on_bus("ctl.replan")[-1] == Replan("operator")
        assert lv.app.state.plans[-1].trigger == "operator"
        await lv.pilot.press("p")
        await lv.pilot.press("y")
        await until(lv.pilot, lambda: lv.app.state.paused, "the pause to be confirmed")
        assert lv.fake.received[-1] == PauseAllocator(True)
        assert "allocator PAUSED" in str(lv.app.query_one("#status").render())
        seq = lv.last_plan_seq()
        await lv.pilot.press("s")
        await lv.pilot.press("c")
        n = await submit(lv, "2.5")
        assert lv.fake.received[-1] == SetChurn(2.5)
        assert lv.sent_on_bus("ctl.churn")[-1] == SetChurn(2.5)
        assert status(lv, n) == "ok" and lv.app.state.churn == 2.5
        assert lv.last_plan_seq() == seq  # paused: no plan
        await lv.pilot.press("p")
        await lv.pilot.press("y")
        await lv.wait_plan(seq, "the plan after resuming")
        assert lv.fake.received[-1] == PauseAllocator(False)
        assert not lv.app.state.paused and lv.app.state.plans[-1].trigger == "resume"


async def test_invalid_input_is_refused_in_the_form(tmp_path: Path) -> None:
    async with live(tmp_path) as lv:
        pilot = lv.pilot
        sent = len(lv.fake.received)
        # through the keys once: a negative demand
        await pilot.press("d")
        await until(pilot, lambda: isinstance(lv.app.screen, CommandForm), "the form")
        form = lv.app.screen
        assert isinstance(form, CommandForm)
        await pilot.press(*"chat-8b", "tab", *"-1", "enter")
        assert form.error is not None and form.error.field == "rps"
        assert "must not be negative" in str(form.query_one("#form-error").render())
        assert lv.app.screen is form and form.query_one("#field-rps").has_class("-invalid")
        await pilot.press("escape")
        cases = [  # every refusal reason is covered in test_state; these go through the form on screen
            ("demand", {"deployment": "nope", "rps": "3"}, "deployment", "unknown deployment 'nope'"),
            ("availability", {"region": "mars-1", "node": "g6.xlarge", "count": "1"}, "region", "unknown region"),
            ("availability", {"region": "aws-us-east-1", "node": "g6.xlarge", "count": "1.5"}, "count", "whole number"),
            ("churn", {"factor": "-0.5"}, "factor", "must not be negative"),
            ("drain", {"instance": "i999"}, "instance", "unknown running instance"),
        ]
        for action, values, field, reason in cases:
            lv.app.action_steer(action, values)
            await pilot.pause()
            form = lv.app.screen
            assert isinstance(form, CommandForm)
            form.submit()
            assert form.error is not None, (action, values)
            assert form.error.field == field and reason in form.error.reason, (action, form.error)
            assert lv.app.screen is form
            form.dismiss(None)
            await pilot.pause()
        assert len(lv.fake.received) == sent
        assert lv.app.state.command_count == 0
        assert not lv.sent_on_bus("ctl.demand")


async def test_without_a_gateway_commands_go_to_the_owner(tmp_path: Path) -> None:
    async with live(tmp_path, fake_name="allocator") as lv:  # a mesh with no ``operator`` (not ``coral up``)
        seq = lv.last_plan_seq()
        await lv.pilot.press("r", "y")
        await lv.wait_plan(seq, "the re-plan")
        assert lv.fake.received == [Replan("operator")]
        assert [c.status for c in lv.app.state.commands] == ["ok"]
        assert lv.mesh.journal is not None
        lv.mesh.journal.flush()
        routed = [(r.kind, r.dest) for r in read_journal(lv.journal) if r.tag == "ctl.replan"]
        assert routed == [("request", "allocator")], "the gateway was not there: the owner got it"
