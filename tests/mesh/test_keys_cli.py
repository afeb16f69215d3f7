"""``coral keys`` and ``coral up --keys``: the key directory from the command line, a non-loopback bind
refused without keys, and a whole run over a CURVE bus."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

import coral.cli
from coral.cli.keys_cmd import is_loopback

from .helpers import World


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_keys_cli_manages_the_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "keys"
    main = coral.cli.main
    assert main(["keys", "--dir", str(d), "init"]) == 0
    assert _mode(d) == 0o700 and _mode(d / "server.key_secret") == 0o600
    assert main(["keys", "--dir", str(d), "add", "worker-a"]) == 0
    assert _mode(d / "clients" / "worker-a.key_secret") == 0o600
    assert main(["keys", "--dir", str(d), "add", "tui"]) == 0
    assert main(["keys", "--dir", str(d), "revoke", "worker-a"]) == 0
    capsys.readouterr()
    assert main(["keys", "--dir", str(d), "list"]) == 0
    assert capsys.readouterr().out.splitlines() == ["tui\tallowed", "worker-a\trevoked"]
    assert main(["keys", "--dir", str(d), "init"]) == 2
    assert "already holds a kernel key pair" in capsys.readouterr().err
    assert main(["keys", "--dir", str(d), "revoke", "nobody"]) == 2
    assert "no allowed client 'nobody'" in capsys.readouterr().err
    assert main(["keys", "--dir", str(tmp_path / "none"), "add", "x"]) == 2
    assert "coral keys init" in capsys.readouterr().err


def test_loopback_detection() -> None:
    assert is_loopback("tcp://127.0.0.1:7450") and is_loopback("tcp://localhost:1") and is_loopback("tcp://[::1]:5")
    assert not is_loopback("tcp://0.0.0.0:7450") and not is_loopback("tcp://*:7450")
    assert not is_loopback("tcp://10.1.2.3:7450") and not is_loopback("tcp://myhost:7450")


def test_up_refuses_a_public_bind_without_keys(
    world: World, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CORAL_KEYS", raising=False)
    args = ["up", "--store", str(world.store), "--no-build", "--bind", "tcp://0.0.0.0:0", "--scenario", "mesh-steady"]
    assert coral.cli.main(args) == 2
    err = capsys.readouterr().err
    assert "tcp://0.0.0.0:0 is reachable from other machines" in err and "coral keys init" in err


def test_up_runs_over_a_curve_bus_on_a_public_bind(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "keys"
    assert coral.cli.main(["keys", "--dir", str(d), "init"]) == 0
    args = ["up", "--scenario", "mesh-steady", "--store", str(world.store), "--speed", "max", "--no-build",
            "--no-deadline", "--bind", "tcp://0.0.0.0:0", "--keys", str(d), "--json"]  # fmt: skip
    capsys.readouterr()
    assert coral.cli.main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    dep = summary["deployments"]["chat-8b"]
    assert summary["reason"] == "end of scenario" and dep["open"] == 0 and dep["completed"] > 200
    assert summary["bus_errors"] == 0
