"""``coral up --gateway --metrics`` from the command line: a live run serves completions and metrics and
stops cleanly; bad addresses and limits are refused with the option named."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import coral.cli
from coral.errors import CoralError
from coral.gateway import parse_address

from ..mesh.helpers import ROOT, World
from ..mesh.test_cli import RUNNER, VERBS


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setattr(coral.cli, "VERB_MODULES", VERBS)
    return coral.cli.main


def test_parse_address() -> None:
    assert parse_address("8000", "--gateway") == ("127.0.0.1", 8000)
    assert parse_address("0.0.0.0:9", "--gateway") == ("0.0.0.0", 9)
    assert parse_address("[::1]:80", "--metrics") == ("::1", 80)
    with pytest.raises(CoralError, match=r"--metrics: port must be in 0\.\.65535"):
        parse_address("localhost:70000", "--metrics")
    with pytest.raises(CoralError, match="--gateway: expected HOST:PORT"):
        parse_address("http://x:1", "--gateway")


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--gateway", "here"], "--gateway: expected HOST:PORT or PORT"),
        (["--metrics", "1:2:3"], "--metrics: expected HOST:PORT or PORT"),
        (["--gateway", "127.0.0.1:0", "--gateway-active", "0"], "--gateway-active: must be at least 1"),
        (["--gateway", "127.0.0.1:0", "--gateway-queue", "-1"], "--gateway-queue: must not be negative"),
    ],
)
def test_up_refuses_bad_gateway_arguments(
    cli: object, world: World, extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert coral.cli.main(["up", "--store", str(world.store), "--no-build", *extra]) == 2
    assert needle in capsys.readouterr().err


def test_up_refuses_a_port_in_use(cli: object, world: World, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["up", "--scenario", "mesh-steady", "--store", str(world.store), "--no-build", "--bind", "inproc",
                "--metrics", f"127.0.0.1:{port}"]  # fmt: skip
        assert coral.cli.main(args) == 2
    assert f"--metrics: cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_live_run_serves_the_gateway_and_metrics(world: World) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", RUNNER, "up", "--scenario", "mesh-steady", "--store", str(world.store), "--no-build",
           "--bind", "tcp://127.0.0.1:0", "--no-status", "--speed", "10", "--gateway", "127.0.0.1:0",
           "--metrics", "127.0.0.1:0"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        urls: dict[str, str] = {}
        while len(urls) < 2:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            for what in ("gateway", "metrics"):
                if f"{what} at http://" in line:
                    urls[what] = line.split(" at ")[1].strip()
        body = json.dumps({"model": "chat-8b", "prompt": "hello", "max_tokens": 3}).encode()
        for _ in range(200):
            req = urllib.request.Request(
                urls["gateway"] + "/v1/completions", body, {"content-type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    doc = json.loads(r.read())
                break
            except urllib.error.HTTPError as e:
                assert e.code == 503  # no serving instance yet
                time.sleep(0.1)
        assert doc["usage"]["completion_tokens"] == 3 and len(doc["choices"][0]["text"].split()) == 3
        with urllib.request.urlopen(urls["metrics"] + "/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'coral_instances{deployment="chat-8b",model="llama-3.1-8b",state="serving"}' in text
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, proc.stderr.read() if proc.stderr else ""
