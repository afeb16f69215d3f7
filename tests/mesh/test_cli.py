"""``coral up`` and ``coral replay`` from the command line: a recorded run replays, bad arguments are
refused with a clear message, and SIGTERM (or ``--for``) ends a live run cleanly with status 0.

``up_cmd`` and ``replay_cmd`` are added to the CLI's verbs here until ``coral.cli.VERB_MODULES`` lists them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import coral.cli
from coral.cli.up_setup import parse_duration, parse_speed
from coral.errors import CoralError
from coral.kernel import Endpoints
from coral.kernel.address import parse_bind

from .helpers import ROOT, World

VERBS = tuple(dict.fromkeys((*coral.cli.VERB_MODULES, "up_cmd", "replay_cmd")))
RUNNER = f"import sys, coral.cli as c; c.VERB_MODULES = {VERBS!r}; sys.exit(c.main(sys.argv[1:]))"


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setattr(coral.cli, "VERB_MODULES", VERBS)
    return coral.cli.main


@pytest.mark.slow
def test_up_records_and_replay_matches(
    cli: object, world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "run.journal"
    args = ["up", "--scenario", "mesh-steady", "--store", str(world.store), "--speed", "max", "--bind", "inproc",
            "--no-build", "--no-deadline", "--record", str(journal), "--json"]  # fmt: skip
    assert coral.cli.main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["reason"] == "end of scenario" and summary["plans"] >= 3 and summary["actor_crashes"] == 0
    dep = summary["deployments"]["chat-8b"]
    assert dep["arrivals"] == dep["completed"] + dep["failed"] > 200 and dep["open"] == 0
    assert coral.cli.main(["replay", str(journal)]) == 0
    out_text = capsys.readouterr().out
    assert "replay matches" in out_text and "differs" not in out_text
    assert coral.cli.main(["replay", str(journal), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["diffs"] == [] and out["decisions"]["plan.new"] == summary["plans"]
    assert (
        coral.cli.main(["up", "--scenario", "mesh-surge", "--store", str(world.store), "--record", str(journal)]) == 2
    )
    assert "exists; give a new file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--speed", "-2"], "--speed: must be a positive number"),
        (["--speed", "fast"], "--speed: expected a number or 'max'"),
        (["--for", "soon"], "--for: expected a duration"),
        (["--bind", "udp://x"], "--bind: expected tcp://HOST:PORT"),
        (["--seed", "-1"], "--seed: must be >= 0"),
        (["--scenario", "nope"], "unknown scenario 'nope'"),
        (["--tui", "--json"], "--tui and --json do not go together"),
    ],
)
def test_up_refuses_bad_arguments(
    cli: object, world: World, extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert coral.cli.main(["up", "--store", str(world.store), "--no-build", *extra]) == 2
    assert needle in capsys.readouterr().err


def test_replay_refuses_what_is_not_a_journal(cli: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert coral.cli.main(["replay", str(tmp_path / "none.journal")]) == 2
    assert "no such journal file" in capsys.readouterr().err
    junk = tmp_path / "junk.journal"
    junk.write_bytes(b"hello world, not a journal")
    assert coral.cli.main(["replay", str(junk)]) == 2
    assert "not a coral journal" in capsys.readouterr().err


def test_argument_parsers() -> None:
    assert parse_duration("90") == 90.0 and parse_duration("5m") == 300.0 and parse_duration("1.5h") == 5400.0
    assert parse_duration("250ms") == 0.25
    assert parse_speed("max") is None and parse_speed("60") == 60.0
    eps = parse_bind("tcp://127.0.0.1:7450")
    assert eps is not None and (eps.router, eps.pub) == ("tcp://127.0.0.1:7450", "tcp://127.0.0.1:7451")
    assert parse_bind("inproc") is None
    ipc = parse_bind("ipc:///tmp/coral")
    assert ipc is not None and ipc.router == "ipc:///tmp/coral.router"
    with pytest.raises(CoralError, match="port"):
        parse_bind("tcp://127.0.0.1:70000")
    with pytest.raises(CoralError, match="positive"):
        parse_duration("0s")


def _start(world: World, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", RUNNER, "up", "--scenario", "mesh-steady", "--store", str(world.store), "--no-build",
           "--bind", "tcp://127.0.0.1:0", "--no-status", *extra]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


@pytest.mark.slow
def test_sigterm_stops_a_live_run_cleanly(world: World) -> None:
    proc = _start(world, "--speed", "5")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the kernel and actors run
        assert "kernel at tcp://127.0.0.1:" in line, line + (proc.stderr.read() if proc.stderr else "")
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, proc.stderr.read() if proc.stderr else ""
    assert "(stopped)" in out


def test_for_limits_the_wall_time(world: World) -> None:
    proc = _start(world, "--speed", "5", "--for", "1s")
    try:
        rc = proc.wait(timeout=30)
        out = proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0 and "(stopped)" in out


def test_up_runs_on_static_hosts_and_checks_the_file(
    cli: object, world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = tmp_path / "hosts.toml"
    hosts.write_text('[[host]]\nname = "box-1"\nregion = "aws-us-east-1"\nnode = "g6e.xlarge"\n')
    base = ["up", "--scenario", "mesh-steady", "--store", str(world.store), "--no-build", "--speed", "max",
            "--bind", "inproc", "--json"]  # fmt: skip
    assert coral.cli.main([*base, "--hosts", str(hosts)]) == 0
    summary = json.loads(capsys.readouterr().out)
    dep = summary["deployments"]["chat-8b"]
    assert dep["completed"] == dep["arrivals"] > 200 and summary["instances"] == 1
    hosts.write_text('[[host]]\nname = "box-1"\nregion = "mars-1"\nnode = "g6e.xlarge"\n')
    assert coral.cli.main([*base, "--hosts", str(hosts)]) == 2
    assert "region 'mars-1' is not among the scenario's" in capsys.readouterr().err
    hosts.write_text('[[host]]\nname = "box-1"\n')
    assert coral.cli.main([*base, "--hosts", str(hosts)]) == 2
    assert "key 'region' must be a non-empty string" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 100])
async def test_up_status_fits_the_terminal(world: World, width: int) -> None:
    from rich.console import Console

    from coral.cli.up_status import render_status

    res = await world.run("mesh-stockout", until=100.0)  # mid-run: instances up, demand on
    setup = world.setup("mesh-stockout")
    eps = Endpoints("tcp://127.0.0.1:7450", "tcp://127.0.0.1:7451")
    con = Console(width=width, record=True, color_system=None)
    con.print(render_status(setup, res.state, 10.0, 60.0, eps, width))
    lines = con.export_text().splitlines()
    assert max(len(line) for line in lines) <= width
    header = next(line for line in lines if "deployment" in line and "┃" in line)
    assert "SLO" in header and ("demand" in header) and ("cap" in header)
    names = [d.deployment for d in res.state.stats.deployments]
    assert names and all(any(f" {n} " in line for line in lines) for n in names)
    wide = Console(width=200, record=True, color_system=None)
    wide.print(render_status(setup, res.state, 10.0, 60.0, eps, 200))
    text = wide.export_text()
    assert "TTFT p50" in text and "capacity req/s" in text and "provisioning" in text
