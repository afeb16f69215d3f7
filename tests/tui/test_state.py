"""The reducer (``tui.state.apply``) and the steering forms' validation, without a terminal."""

from __future__ import annotations

import copy

import attrs
import pytest

from coral.kernel import ActorCrashed, Envelope, read_journal
from coral.messages import (
    ForbidTemplate,
    MarketUpdate,
    PauseAllocator,
    PinTemplate,
    Quote,
    Replan,
    SetAvailability,
    SetChurn,
    SetDemand,
    SetPrice,
    SetSlo,
)
from coral.messages.control import CommandResult, DrainInstance
from tui import model as M
from tui import reducer as R
from tui import steering as St
from tui.widgets.header import render_header

from .helpers import DEMO, GPU_OF


def envelopes() -> list[Envelope]:
    return [Envelope(r.kind, r.source, r.tag, r.decode(), r.corr) for r in read_journal(DEMO) if R.wanted(r.tag)]


@pytest.fixture(scope="module")
def final() -> M.State:
    return R.apply_all(M.initial_state(gpu_of=GPU_OF), envelopes())


def test_the_demo_journal_folds_into_the_story(final: M.State) -> None:
    st = final
    assert st.scenario == "default" and st.policy == "coral" and st.ended == "end of scenario"
    assert st.now == 300.0
    assert [p.seq for p in st.plans] == [1, 2] and st.plans[1].trigger == "market"
    assert (st.plans[1].starts, st.plans[1].stops) == (2, 1)
    assert sorted(st.instances) == ["i1", "i2", "i3", "i4", "i5", "i7", "i8"]
    assert st.instances["i2"].state == "lost" and st.instances["i2"].since == 265.0 and not st.instances["i2"].live
    assert all(i.state == "serving" for i in st.instances.values() if i.id != "i2")
    assert st.live_instances == 6
    assert st.market[("aws-us-east-1", "p5.4xlarge")].stockout
    assert st.market[("aws-us-east-1", "p5.4xlarge")].prev_availability == 4
    assert st.market[("gcp-us-central1", "g2-standard-4")].prev_price == pytest.approx(0.705)
    assert st.recent(st.market[("aws-us-east-1", "p5.4xlarge")])
    assert not st.recent(st.market[("aws-us-east-1", "g6.xlarge")])
    d = st.deployments["chat-8b"]
    assert d.model == "llama-3.1-8b" and d.override and d.demand == 9.0 and d.estimate == 6.2
    assert d.capacity == pytest.approx(3.2 + 1.9)  # i2 was lost: i1 and i3 serve
    assert d.history and d.history[-1].t == 295.0
    slo = st.deployments["code-14b"].slo
    assert slo is not None and slo.ttft_s == 1.5
    assert st.crashes == 2 and st.down == frozenset({"worker-n51"}) and st.errors == 1
    assert st.cost_per_hour == pytest.approx(15.922)
    assert 0 < st.attainment < 1 and st.goodput > 0
    kinds = {e.kind for e in st.events}
    assert {"crash", "fault", "error", "command", "plan", "fleet", "market", "demand", "peer", "mesh"} <= kinds
    assert len(st.templates) == 6
    assert [s.gpu for s in st.templates["e2a4c6e8a0c2e4a6c8e0a2c4"].stages] == ["l40s-48g", "h100-80g"]


def test_apply_never_changes_its_input() -> None:
    st = M.initial_state(gpu_of=GPU_OF)
    for env in envelopes():
        before = copy.deepcopy(st)
        new = R.apply(st, env)
        assert st == before
        st = new


def test_goodput_is_measured_over_a_window(final: M.State) -> None:
    # the demo's reports come every 5 s; over the last 60 s about 10 requests/s met the SLO
    assert final.goodput == pytest.approx(9.95, abs=0.01)
    assert final.stats_hist[-1][0] - final.stats_hist[0][0] >= M.GOODPUT_S


def test_unknown_tags_and_clock_marks() -> None:
    st = M.initial_state()
    assert R.apply(st, Envelope("publish", "x", "req.counts", object())) is st
    marked = R.apply(st, Envelope("publish", "tui", R.CLOCK_TAG, 42.0))
    assert marked.now == 42.0 and R.apply(marked, Envelope("publish", "tui", R.CLOCK_TAG, 10.0)).now == 42.0


def test_merge_keeps_the_union_of_market_changes() -> None:
    a, b = Quote("r", "n1", 1.0, 1), Quote("r", "n2", 2.0, 2)
    older = Envelope("publish", "pw", "mkt.update", MarketUpdate(1, 1.0, (a, b), (a,)))
    b2 = attrs.evolve(b, availability=0)
    newer = Envelope("publish", "pw", "mkt.update", MarketUpdate(2, 2.0, (a, b2), (b2,)))
    merged = R.merge_snapshots(older, newer)
    assert merged.msg.seq == 2 and merged.msg.changed == (a, b2)
    assert (
        R.merge_snapshots(Envelope("publish", "s", "req.stats", 1), Envelope("publish", "s", "req.stats", 2)).msg == 2
    )


def test_link_and_actor_events() -> None:
    st = R.with_link(M.initial_state(), M.Link("lost", "no answer", "tcp://x"))
    assert st.events[-1].severity == "warn" and "no answer" in st.events[-1].text
    assert R.with_link(st, st.link) is st
    st = R.apply(st, Envelope("publish", "kernel", "kernel.actor.crashed", ActorCrashed("router", "boom", 1)))
    assert st.crashes == 1 and st.events[-1].kind == "crash"
    st = R.with_dropped(st, 7)
    assert st.dropped == 7 and "7 events dropped" in st.events[-1].text


def test_events_are_bounded() -> None:
    st = M.initial_state()
    for k in range(M.MAX_EVENTS + 10):
        st = R.apply(st, Envelope("publish", "k", "kernel.actor.crashed", ActorCrashed("a", str(k), 1)))
    assert len(st.events) == M.MAX_EVENTS and st.events[-1].n == M.MAX_EVENTS + 10


# -- steering forms --------------------------------------------------------------------------------


def test_every_action_builds_its_typed_command(final: M.State) -> None:
    st = final
    cases = {
        ("demand", ("chat-8b", "12"), False): SetDemand("chat-8b", 12.0),
        ("demand", ("chat-8b", "12"), True): SetDemand("chat-8b", None),
        ("availability", ("aws-us-east-1", "g6.xlarge", "0"), False): SetAvailability("aws-us-east-1", "g6.xlarge", 0),
        ("availability", ("aws-us-east-1", "g6.xlarge", ""), True): SetAvailability("aws-us-east-1", "g6.xlarge", None),
        ("price", ("aws-us-east-1", "g6.xlarge", "0.9"), False): SetPrice("aws-us-east-1", "g6.xlarge", 0.9),
        ("slo", ("code-14b", "1", "0.05", "0.95"), False): SetSlo("code-14b", 1.0, 0.05, 0.95),
        ("forbid", ("a1c8",), False): ForbidTemplate("a1c8e3f0b2d4e6f8a0b2c4d6", True),
        ("allow", ("a1c8e3f0b2d4e6f8a0b2c4d6",), False): ForbidTemplate("a1c8e3f0b2d4e6f8a0b2c4d6", False),
        ("pin", ("chat-8b", "b7d2"), False): PinTemplate("chat-8b", "b7d2c1e9f3a5b7c9d1e3f5a7"),
        ("pin", ("chat-8b", "b7d2"), True): PinTemplate("chat-8b", None),
        ("drain", ("i7",), False): DrainInstance("i7"),
        ("replan", (), False): Replan("operator"),
        ("pause", (), False): PauseAllocator(True),
        ("churn", ("0",), False): SetChurn(0.0),
    }
    for (action, args, clear), want in cases.items():
        names = [f.name for f in St.ACTIONS[action].fields]
        assert St.build_command(st, action, dict(zip(names, args, strict=True)), clear=clear) == want, action
    assert {a for a, _, _ in cases} == set(St.ACTIONS)


def test_a_blank_field_is_never_a_clear(final: M.State) -> None:
    """Blank used to mean "clear the override": now it is refused, and only Clear clears."""
    for action, values in (
        ("demand", {"deployment": "chat-8b", "rps": ""}),
        ("availability", {"region": "aws-us-east-1", "node": "g6.xlarge", "count": " "}),
        ("pin", {"deployment": "chat-8b", "template_id": ""}),
    ):
        with pytest.raises(St.FormError, match="required") as err:
            St.build_command(final, action, values)
        assert St.ACTIONS[action].clear_label in err.value.reason
    with pytest.raises(St.FormError, match="nothing to clear"):
        St.build_command(final, "churn", {"factor": "1"}, clear=True)


@pytest.mark.parametrize(
    ("action", "values", "field", "reason"),
    [
        ("demand", {"deployment": "chat-8b", "rps": "-2"}, "rps", "must not be negative, got -2"),
        ("demand", {"deployment": "chat-8b", "rps": "inf"}, "rps", "must be finite"),
        ("demand", {"deployment": "", "rps": "2"}, "deployment", "required"),
        (
            "demand",
            {"deployment": "chat-9b", "rps": "2"},
            "deployment",
            "unknown deployment 'chat-9b' (known: chat-32b",
        ),
        ("availability", {"region": "aws-us-east-1", "node": "a2-highgpu-1g", "count": "1"}, "node", "unknown node"),
        ("availability", {"region": "aws-us-east-1", "node": "g6.xlarge", "count": "-1"}, "count", "not be negative"),
        ("price", {"region": "aws-us-east-1", "node": "g6.xlarge", "price": "x"}, "price", "expected a number"),
        ("slo", {"deployment": "chat-8b", "ttft_s": "0", "tpot_s": "1", "attainment": "0.9"}, "ttft_s", "positive"),
        ("slo", {"deployment": "chat-8b", "ttft_s": "1", "tpot_s": "", "attainment": "0.9"}, "tpot_s", "required"),
        ("forbid", {"template_id": ""}, "template_id", "required"),
        ("allow", {"template_id": "zz"}, "template_id", "unknown template 'zz'"),
        ("pin", {"deployment": "chat-8b", "template_id": "e2a4"}, "template_id", "serves qwen3-32b"),
        ("drain", {"instance": "i2"}, "instance", "instance i2 is lost, not running"),
        ("drain", {"instance": "i9"}, "instance", "unknown running instance 'i9'"),
        ("churn", {"factor": ""}, "factor", "required"),
    ],
)
def test_bad_input_names_the_field_and_the_reason(
    final: M.State, action: str, values: dict[str, str], field: str, reason: str
) -> None:
    with pytest.raises(St.FormError) as err:
        St.build_command(final, action, values)
    assert err.value.field == field
    assert reason in err.value.reason


def test_names_cannot_be_checked_before_the_mesh_said_anything() -> None:
    with pytest.raises(St.FormError, match="no deployment known yet"):
        St.build_command(M.initial_state(), "demand", {"deployment": "chat-8b", "rps": "1"})
    with pytest.raises(St.FormError, match="no templates known yet"):
        St.build_command(M.initial_state(), "forbid", {"template_id": "abc"})


def test_an_ambiguous_prefix_is_refused(final: M.State) -> None:
    st = R.add_templates(final, [])
    st = attrs.evolve(st, templates={**st.templates, "a1c9": st.templates["a1c8e3f0b2d4e6f8a0b2c4d6"]})
    with pytest.raises(St.FormError, match="matches several templates"):
        St.build_command(st, "forbid", {"template_id": "a1c"})


def test_defaults_prefill_the_selection_and_show_the_current_value_apart(final: M.State) -> None:
    assert St.defaults(final, "slo", {"deployment": "code-14b"}) == {
        "deployment": "code-14b", "ttft_s": "1.5", "tpot_s": "0.05", "attainment": "0.9",
    }  # fmt: skip
    assert St.defaults(final, "demand", {"deployment": "chat-8b"}) == {"deployment": "chat-8b", "rps": ""}
    assert St.current(final, "demand", {"deployment": "chat-8b"}).startswith("now 9 req/s, fixed by an operator")
    assert St.current(final, "pin", {"deployment": "chat-8b"}) == "now not pinned"
    assert St.defaults(final, "slo", {"deployment": "code-14b", "ttft_s": "3"})["ttft_s"] == "3"
    assert St.suggestions(final, "node", {"region": "gcp-us-central1"}) == [
        "a2-highgpu-1g", "a2-ultragpu-1g", "g2-standard-4",
    ]  # fmt: skip
    assert St.suggestions(final, "instance") == ["i1", "i3", "i4", "i5", "i7", "i8"]


def test_results_are_reflected(final: M.State) -> None:
    st, n = R.note_sent(final, "pause", PauseAllocator(True))
    assert st.commands[-1].status == "pending"
    ok = CommandResult("ctl.pause", True, "allocator", 1.0)
    st = R.note_result(st, n, PauseAllocator(True), ok)
    assert st.paused and st.commands[-1].status == "ok"
    st, n = R.note_sent(st, "forbid", ForbidTemplate("a1c8e3f0b2d4e6f8a0b2c4d6"))
    st = R.note_result(st, n, ForbidTemplate("a1c8e3f0b2d4e6f8a0b2c4d6"), CommandResult("ctl.forbid", True, "a", 1.0))
    assert "a1c8e3f0b2d4e6f8a0b2c4d6" in st.forbidden
    assert St.build_command(st, "pause", {}) == PauseAllocator(False)
    refused = CommandResult("ctl.churn", False, "allocator", 1.0, "factor", "too big")
    st, n = R.note_sent(st, "churn", SetChurn(9.0))
    st = R.note_result(st, n, SetChurn(9.0), refused)
    assert st.churn is None and (st.commands[-1].status, st.commands[-1].reason) == ("refused", "too big")
    st, n = R.note_sent(st, "replan", Replan())
    st = R.note_result(st, n, Replan(), None, "no reply within 15s")
    assert st.commands[-1].status == "failed" and st.events[-1].severity == "error"


def test_a_command_without_an_answer_fails_after_the_bound(final: M.State) -> None:
    st, n = R.note_sent(final, "replan", Replan(), at=100.0)
    assert R.expire_commands(st, 100.0 + M.COMMAND_TIMEOUT_S - 0.1, M.COMMAND_TIMEOUT_S) is st
    assert st.waiting_commands == 1
    st = R.expire_commands(st, 100.0 + M.COMMAND_TIMEOUT_S, M.COMMAND_TIMEOUT_S)
    c = st.commands[-1]
    assert (c.n, c.status, st.waiting_commands) == (n, "failed", 0)
    assert f"no answer within {M.COMMAND_TIMEOUT_S:g} s" in c.reason and "not resent" in c.reason
    assert st.events[-1].severity == "error" and f"#{n} re-plan" in st.events[-1].text.lower()
    again = R.note_result(st, n, Replan(), None, "no reply within 15s")  # the bus's timeout, later: no change
    assert again is st
    late = R.note_result(st, n, Replan(), CommandResult("ctl.replan", True, "allocator", 1.0))
    assert late.commands[-1].status == "ok"  # an answer that does come is recorded


def test_losing_the_link_fails_waiting_commands_and_reconnecting_says_they_were_dropped(final: M.State) -> None:
    st = R.with_link(final, M.Link("connected", "as tui-1", "x"))
    st, done = R.note_sent(st, "pause", PauseAllocator(True), at=1.0)
    st = R.note_result(st, done, PauseAllocator(True), CommandResult("ctl.pause", True, "allocator", 1.0))
    st, a = R.note_sent(st, "replan", Replan(), at=2.0)
    st, b = R.note_sent(st, "churn", SetChurn(2.0), at=3.0)
    st = R.with_link(st, M.Link("lost", "no answer from the kernel within 3s; retrying", "x"))
    assert [(c.n, c.status) for c in st.commands[-3:]] == [(done, "ok"), (a, "failed"), (b, "failed")]
    assert all(c.reason == M.LINK_LOST for c in st.commands[-2:]) and st.unanswered == (a, b)
    assert R.with_link(st, M.Link("lost", "still gone; retrying", "x")).unanswered == (a, b)
    st = R.with_link(st, M.Link("connecting", "", "x"))
    st = R.with_link(st, M.Link("connected", "as tui-2", "x"))
    assert st.unanswered == () and st.commands[-1].status == "failed"
    last = st.events[-1]
    assert last.kind == "command" and last.severity == "warn"
    assert "2 command(s)" in last.text and "dropped, not resent" in last.text
    assert f"#{a} re-plan" in last.text.lower() and f"#{b}" in last.text


def test_describe_every_command() -> None:
    texts = [
        St.describe_command(c)
        for c in (
            SetDemand("d", 1.0), SetDemand("d"), SetAvailability("r", "n", 0), SetPrice("r", "n", 2.0),
            SetSlo("d", 1.0, 0.1), ForbidTemplate("t" * 24), PinTemplate("d", "t" * 24), PinTemplate("d"),
            DrainInstance("i1"), Replan(), PauseAllocator(False), SetChurn(2.0),
        )
    ]  # fmt: skip
    assert texts[0] == "demand d = 1 req/s" and texts[1] == "demand d = clear"
    assert "unpin" in texts[7] and texts[10] == "resume allocator"
    assert len(set(texts)) == len(texts)


def test_allocator_settings_come_from_its_published_state(final: M.State) -> None:
    from coral.messages.control import AllocatorState

    dep = sorted(final.deployments)[0]
    env = Envelope(
        "publish", "allocator", "ctl.alloc_state", AllocatorState(9.0, True, 0.25, ((dep, "t-1"),), ("t-2",))
    )
    st = R.apply(final, env)
    assert st.paused and st.churn == 0.25 and st.forbidden == {"t-2"} and st.deployments[dep].pinned == "t-1"
    back = R.apply(st, Envelope("publish", "allocator", "ctl.alloc_state", AllocatorState(10.0, False, 1.0)))
    assert not back.paused and back.churn == 1.0 and not back.forbidden and back.deployments[dep].pinned is None


def test_live_messages_the_snapshot_covers_are_skipped(final: M.State) -> None:
    from coral.messages.control import AllocatorState
    from tui.reducer import covered_by as _covered

    newer = AllocatorState(9.0, True, 1.0)
    covered = {"ctl.alloc_state": newer}
    older = Envelope("publish", "allocator", "ctl.alloc_state", AllocatorState(8.0, False, 1.0))
    later = Envelope("publish", "allocator", "ctl.alloc_state", AllocatorState(12.0, False, 1.0))
    assert _covered(covered, older) and not _covered(covered, later)
    assert _covered(covered, Envelope("publish", "allocator", "ctl.alloc_state", newer))
    assert not _covered(covered, Envelope("publish", "x", "fleet.update", newer))


@pytest.mark.parametrize(("width", "shown"), [(200, "1 sent, awaiting answer"), (60, "1 cmd waiting")])
def test_a_command_awaiting_its_answer_shows_in_the_header_short_when_narrow(width: int, shown: str) -> None:
    state = M.State(link=M.Link("connected"), commands=(M.CommandView(1, "replan", "re-plan"),), errors=2)
    line = render_header(state, width).plain.splitlines()[1]
    assert shown in line and "errors 2" in line, line
