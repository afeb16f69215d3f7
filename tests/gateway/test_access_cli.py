"""``coral keys api`` and ``coral up``'s access checks from the command line: keys shown once, bad input
refused with one line, a non-loopback ``--gateway``/``--metrics`` without keys refused, and a live run with
keys in which every listening socket of the process tree is on loopback or refuses a request without a key,
and neither the journal nor the output holds a key."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import coral.cli
from coral.cli.apikeys_cmd import up_access
from coral.errors import CoralError
from coral.gateway.auth import Guarded, key_file, load_keys
from coral.kernel import read_journal
from coral.kernel.keys import init_keys
from coral.messages import ApiRefused

from ..mesh.helpers import ROOT, World
from ..mesh.test_cli import RUNNER, VERBS


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setattr(coral.cli, "VERB_MODULES", VERBS)
    return coral.cli.main


def test_keys_api_add_list_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = str(tmp_path / "keys")
    assert coral.cli.main(["keys", "--dir", d, "api", "add", "alice", "--models", "chat,b", "--rate", "120/min"]) == 0
    out = capsys.readouterr().out
    key = out.strip().splitlines()[-1]
    assert key.startswith("sk-coral-") and key not in key_file(Path(d)).read_text()
    assert coral.cli.main(["keys", "--dir", d, "api", "list"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith("alice\tactive\tb,chat\t2/s\t") and key not in listed
    before = key_file(Path(d)).read_text()
    for bad, needle in [
        (["add", "bob", "--rate", "fast"], "--rate: expected R/s"),
        (["add", "bob", "--models", ","], "--models: expected model names"),
        (["add", "alice"], "NAME: key 'alice' exists"),
        (["revoke", "carol"], "NAME: no key 'carol'"),
    ]:
        assert coral.cli.main(["keys", "--dir", d, "api", *bad]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, err
    assert key_file(Path(d)).read_text() == before
    assert coral.cli.main(["keys", "--dir", d, "api", "revoke", "alice"]) == 0
    assert load_keys(key_file(Path(d)))[0].revoked


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--gateway", "0.0.0.0:0"], "--gateway: 0.0.0.0:0 is reachable from other machines and no API key exists"),
        (["--metrics", "0.0.0.0:0"], "--metrics: 0.0.0.0:0 is reachable from other machines and no API key exists"),
        (["--gateway", "127.0.0.1:0", "--tls-cert", "x.pem"], "--tls-cert and --tls-key: give both"),
        (["--gateway", "127.0.0.1:0", "--tls-cert", "x.pem", "--tls-key", "y.pem"], "--tls-cert: x.pem: no such file"),
    ],
)
def test_up_refuses_open_sockets_without_keys(
    cli: object, world: World, tmp_path: Path, extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "keys"
    args = ["up", "--store", str(world.store), "--no-build", "--bind", "inproc", "--keys", str(d), *extra]
    assert coral.cli.main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    if "reachable" in needle:
        assert f"create one with `coral keys --dir {d} api add NAME`" in err
    assert not d.exists()  # nothing was made


def test_up_access_rules(tmp_path: Path) -> None:
    def ns(**kw: object) -> argparse.Namespace:
        return argparse.Namespace(**{"metrics_public": False, "tls_cert": None, "tls_key": None, **kw})

    d = tmp_path / "keys"
    # loopback needs no key; a public --metrics is allowed when asked for; keys make both addresses allowed
    assert not up_access(ns(), ("127.0.0.1", 1), ("::1", 2), d).auth.enforced
    assert up_access(ns(metrics_public=True), None, ("0.0.0.0", 2), d).metrics_public
    with pytest.raises(CoralError, match="--gateway: my-host:1 is reachable"):
        up_access(ns(metrics_public=True), ("my-host", 1), ("0.0.0.0", 2), d)  # a host name is not loopback
    coral.cli.main(["keys", "--dir", str(d), "api", "add", "k"])
    access = up_access(ns(), ("0.0.0.0", 1), ("0.0.0.0", 2), d)
    assert access.auth.enforced and access.auth.active == 1
    from prometheus_client import CollectorRegistry

    assert isinstance(access.metrics_app(CollectorRegistry(), object()), Guarded)
    public = up_access(ns(metrics_public=True), None, ("0.0.0.0", 2), d)
    assert not isinstance(public.metrics_app(CollectorRegistry(), object()), Guarded)


def _tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    parents: dict[int, int] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                parents[int(p.name)] = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += [c for c, pp in parents.items() if pp == pid]
    return out


def _listening(pids: list[int]) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket the processes hold."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    out = []
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))  # per 32-bit word, host order
            out.append((str(ipaddress.ip_address(raw)), int(hexport, 16)))
    return out


def _get(url: str, key: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.slow
def test_live_run_with_keys_every_socket_is_loopback_or_authenticated(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "keys"
    init_keys(d)  # the bus's CURVE keys
    assert coral.cli.main(["keys", "--dir", str(d), "api", "add", "app", "--models", "chat-8b"]) == 0
    key = capsys.readouterr().out.strip().splitlines()[-1]
    journal = tmp_path / "run.journal"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", RUNNER, "up", "--scenario", "mesh-steady", "--store", str(world.store), "--no-build",
           "--bind", "tcp://127.0.0.1:0", "--keys", str(d), "--no-status", "--speed", "10", "--record", str(journal),
           "--gateway", "0.0.0.0:0", "--metrics", "0.0.0.0:0"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        urls: dict[str, str] = {}
        lines = []
        while len(urls) < 2:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            lines.append(line)
            for what in ("gateway", "metrics"):
                if f"{what} at http://" in line:
                    urls[what] = line.split(" at ")[1].strip().replace("0.0.0.0", "127.0.0.1")
        gw, metrics = urls["gateway"], urls["metrics"]
        body = json.dumps({"model": "chat-8b", "prompt": "hello", "max_tokens": 3}).encode()
        hdr = {"content-type": "application/json"}
        for _ in range(300):
            req = urllib.request.Request(gw + "/v1/completions", body, {**hdr, "authorization": f"Bearer {key}"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    doc = json.loads(r.read())
                break
            except urllib.error.HTTPError as e:
                assert e.code == 503, e.read()  # no serving instance yet
                time.sleep(0.1)
        assert doc["usage"]["completion_tokens"] == 3
        for _ in range(3):
            with pytest.raises(urllib.error.HTTPError) as no_key:
                urllib.request.urlopen(urllib.request.Request(gw + "/v1/completions", body, hdr), timeout=30)
            assert no_key.value.code == 401

        # every listening socket of the run (the process and its children): loopback, or refuses without a key
        sockets = _listening(_tree(proc.pid))
        public = [(a, p) for a, p in sockets if not ipaddress.ip_address(a).is_loopback]
        assert {p for _, p in public} == {int(u.rsplit(":", 1)[1]) for u in urls.values()}, sockets
        for _, port in public:
            codes = {path: _get(f"http://127.0.0.1:{port}{path}")[0] for path in ("/v1/models", "/metrics")}
            assert 401 in codes.values() and 200 not in codes.values(), (port, codes)
        assert all(ipaddress.ip_address(a).is_loopback for a, _ in sockets if (a, _) not in public)

        time.sleep(1.5)  # the merged refusal report goes out at a quiet point after a second
        st, text = _get(metrics + "/metrics", key)
        assert st == 200 and 'coral_gateway_refused_total{code="401",key="(none)"}' in text
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert key not in "".join(lines) + rest + err
    assert key.encode() not in journal.read_bytes()
    refused = [m for r in read_journal(journal) if isinstance(m := r.decode(), ApiRefused)]
    assert refused and {(m.key, m.status) for m in refused} >= {("(none)", 401)}
    assert sum(m.count for m in refused if m.key == "(none)") >= 3
