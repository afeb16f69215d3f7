"""The bus worker's flood merging, the journal replay source, addresses and import hygiene."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import pytest

from coral.cli import common, tui_cmd
from coral.errors import CoralError
from coral.kernel import BusError, Endpoints, Envelope
from coral.messages import DeploymentTraffic, FleetAction, RoutingStats
from tui import model as M
from tui import reducer as R
from tui.bus import Pending, ReplaySource, check_speed, default_endpoints, parse_address

from .helpers import DEMO, ROOT, replay_app, until


def stats(seq: int) -> Envelope:
    t = DeploymentTraffic("d", seq, seq, seq, 0, {}, 0, 0, 0, seq, 0.1, 0.2, 0.01, 0.02, 1.0, 1.0)
    return Envelope("publish", "router", "req.stats", RoutingStats(seq, float(seq), (t,)))


def action(k: int) -> Envelope:
    return Envelope("publish", "supervisor", "fleet.action", FleetAction(float(k), "start", f"i{k}", "d", "t", "r"))


def test_no_merging_below_the_flood_threshold() -> None:
    p = Pending(merge_after=100)
    for k in range(1, 11):
        p.add(stats(k))
        p.add(action(k))
    items, dropped = p.take()
    assert len(items) == 20 and dropped == 0 and p.merged == 0
    assert len(p) == 0


def test_a_flood_merges_snapshots_and_keeps_every_event_in_time() -> None:
    p = Pending(merge_after=4)
    for k in range(1, 101):
        p.add(stats(k))
        if k % 10 == 0:
            p.add(action(k))
    items, dropped = p.take()
    assert dropped == 0 and p.merged > 90
    assert [e.msg.seq for e in items if e.tag == "req.stats"][-1] == 100
    assert sum(1 for e in items if e.tag == "req.stats") < 5
    assert [e.msg.at for e in items if e.tag == "fleet.action"] == [float(k) for k in range(10, 101, 10)]
    st = M.initial_state()
    times = []
    for env in items:
        st = R.apply(st, env)
        if env.tag == "fleet.action":
            times.append(st.now)
    assert times == [float(k) for k in range(10, 101, 10)], "clock marks keep later events' time"
    marks = [e for e in items if e.tag == R.CLOCK_TAG]
    assert len(marks) <= 11, "no two marks without an event between them"


def test_past_the_event_budget_the_oldest_events_are_dropped_and_counted() -> None:
    p = Pending(max_events=50, merge_after=10)
    for k in range(1, 201):
        p.add(action(k))
    p.add(stats(1))
    items, dropped = p.take()
    kept = [e.msg.at for e in items if e.tag == "fleet.action"]
    assert dropped + len(kept) == 200 and len(kept) >= 50 and kept[-1] == 200.0
    assert any(e.tag == "req.stats" for e in items)


async def test_replay_pause_and_speed() -> None:
    app = replay_app(DEMO, speed=1e-3)  # a millisecond of replay per second: stuck after the first record
    async with app.run_test() as pilot:
        await until(pilot, lambda: app.state.scenario == "default", "the first record")
        await pilot.pause(0.2)
        assert not app.state.plans and app.state.link.detail == "x0.001"
        await pilot.press("space")
        assert app.state.link.detail == "x0.001 paused"
        for _ in range(3):
            await pilot.press("right_square_bracket")
        assert app.source.speed == pytest.approx(8e-3)  # type: ignore[attr-defined]
        app.source.set_speed(math.inf)  # type: ignore[attr-defined]
        await pilot.press("space")
        await until(pilot, lambda: app.state.link.state == "replay-ended", "the end of the replay")
        assert len(app.state.plans) == 2
        assert not app.check_action("steer", ("demand",)) and not app.check_action("replan", ())
        app.action_steer("demand")
        assert not app.screen_stack[1:], "a replay opens no steering form"


def test_bad_replay_arguments() -> None:
    with pytest.raises(CoralError, match="no such journal"):
        ReplaySource(ROOT / "nope.jrnl")
    for bad in (0, -1.0, math.nan, True):
        with pytest.raises(CoralError, match="--speed"):
            check_speed(bad)


def test_addresses() -> None:
    assert default_endpoints() == Endpoints("tcp://127.0.0.1:7450", "tcp://127.0.0.1:7451")
    assert parse_address("tcp://10.0.0.2:9000") == Endpoints("tcp://10.0.0.2:9000", "tcp://10.0.0.2:9001")
    assert parse_address("ipc:///run/coral/bus") == Endpoints("ipc:///run/coral/bus.router", "ipc:///run/coral/bus.pub")
    assert parse_address("tcp://h:1, tcp://h:5") == Endpoints("tcp://h:1", "tcp://h:5")
    for bad in ("inproc", "tcp://h:0", "tcp://h:x", "localhost:7450", "tcp://h:1,udp://h:2"):
        with pytest.raises(BusError, match="--connect"):
            parse_address(bad)


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="coral")
    sub = parser.add_subparsers(dest="command", required=True)
    tui_cmd.add(sub, common.parent_parser())
    return parser.parse_args(["tui", *argv])


def test_cli_arguments() -> None:
    args = _cli("--replay", str(DEMO), "--speed", "max")
    assert args.replay == DEMO and tui_cmd.parse_speed(args.speed) == math.inf
    assert tui_cmd.parse_speed("2.5") == 2.5
    for bad in ("0", "-1", "fast", "nan"):
        with pytest.raises(CoralError, match="--speed"):
            tui_cmd.parse_speed(bad)
    with pytest.raises(CoralError, match="only with --replay"):
        tui_cmd.run_tui_cmd(_cli("--speed", "4"))
    with pytest.raises(CoralError, match="no such journal file"):
        tui_cmd.run_tui_cmd(_cli("--replay", "missing.jrnl"))
    with pytest.raises(BusError, match="--connect"):
        tui_cmd.run_tui_cmd(_cli("--connect", "nowhere"))
    with pytest.raises(SystemExit):
        _cli("--connect", "tcp://h:1", "--replay", str(DEMO))


def test_the_tui_imports_neither_actors_nor_solvers_nor_highs() -> None:
    code = (
        "import sys, tui.app, tui.bus, tui.reducer, coral.cli.tui_cmd; "
        "print(sorted(m for m in ('actors', 'solvers', 'highspy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_tui_sources_import_only_coral() -> None:
    for path in sorted((ROOT / "tui").rglob("*.py")):
        text = path.read_text()
        for banned in ("import actors", "from actors", "import solvers", "from solvers", "highspy"):
            assert banned not in text, f"{path.relative_to(ROOT)} mentions {banned!r}"


def test_tui_opens_no_store_scenario_or_catalog_file() -> None:
    """Templates, deployments and GPU types come from the mesh, so that the TUI works against a remote one."""
    for path in sorted((ROOT / "tui").rglob("*.py")):
        text = path.read_text()
        for banned in ("sqlite3", "coral.store", "TemplateStore", "tomllib", "load_catalog", "load_scenario"):
            assert banned not in text, f"{path.relative_to(ROOT)} mentions {banned!r}"


def test_only_the_reducer_and_steering_read_message_fields() -> None:
    for path in sorted((ROOT / "tui").rglob("*.py")):
        if path.name in ("model.py", "reducer.py", "steering.py"):
            continue
        text = path.read_text()
        assert "coral.messages" not in text.replace("coral.messages.control import OPERATOR", ""), path


def test_demo_fixture_exists() -> None:
    assert Path(DEMO).stat().st_size > 1000
