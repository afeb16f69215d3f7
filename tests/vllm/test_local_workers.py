"""``coral up --backend vllm`` without ``--hosts``: its local hosts, and the refusals around them (no vLLM
server needed; ``test_up.py`` runs the local workers with real servers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral.catalog import Catalog, load_catalog
from coral.cli import main
from coral.cli.up_setup import load_hosts
from coral.cli.up_workers import LOCAL_PREFIX, LocalWorkers, is_local, local_hosts
from coral.errors import CoralError
from coral.kernel.keys import init_keys, list_clients
from coral.messages.mesh import Host
from coral.scenario import Scenario, load_scenario, scenario_catalogs
from coral.vllm.engine import VllmBackend
from coral.vllm.hosted import HostedFleet, HostTable
from coral.vllm.tiny import TINY_MODEL
from tests.conftest import FIXTURES

TINY = FIXTURES / "scenarios" / "tiny-cpu.toml"


def tiny() -> tuple[Scenario, Catalog]:
    cat = load_catalog(scenario_catalogs(str(TINY)))
    return load_scenario(str(TINY), cat), cat


def test_one_local_host_per_node_the_offers_hold() -> None:
    sc, cat = tiny()
    hosts = local_hosts(sc, cat)
    assert hosts == (Host("coral-local-1", "local", "cpu-local"), Host("coral-local-2", "local", "cpu-local"))
    assert is_local(hosts) and not is_local((*hosts, Host("gpu-a", "local", "cpu-local")))


def test_a_hosts_file_may_not_use_the_local_names(tmp_path: Path) -> None:
    sc, _ = tiny()
    f = tmp_path / "hosts.toml"
    f.write_text(f'[[host]]\nname = "{LOCAL_PREFIX}1"\nregion = "local"\nnode = "cpu-local"\n')
    with pytest.raises(CoralError) as e:
        load_hosts(f, sc)
    assert str(e.value) == (
        f"--hosts: {f}: [[host]] #1: name 'coral-local-1': names starting 'coral-local-' are a local run's"
    )


def test_local_workers_need_a_tcp_kernel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = tmp_path / "s.db"
    args = ["up", "--backend", "vllm", "--scenario", str(TINY), "--store", str(store), "--bind", "inproc"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "coral: error: --bind: the vllm backend's local workers connect to the kernel over tcp, got 'inproc'; "
        "bind tcp://127.0.0.1:PORT (the default)"
    ]
    assert not store.exists()


def test_keys_are_added_for_the_local_workers_only_when_missing(tmp_path: Path) -> None:
    keys = init_keys(tmp_path / "keys")
    hosts = (Host("coral-local-1", "local", "cpu-local"), Host("coral-local-2", "local", "cpu-local"))
    w = LocalWorkers(hosts, (), tmp_path / "work", keys, b"", {"cpu-local": 1})
    w.check_keys()
    first = dict(list_clients(keys))
    assert sorted(first) == ["coral-local-1", "coral-local-2"]
    w.check_keys()  # a second run keeps them
    assert dict(list_clients(keys)) == first


def test_a_worker_refuses_a_bad_engine_secret_in_its_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CORAL_ENGINE_SECRET", "not hex")
    monkeypatch.delenv("CORAL_KEYS", raising=False)
    args = ["worker", "--kernel", "tcp://127.0.0.1:9", "--name", "coral-local-1", "--region", "local"]
    args += ["--node", "cpu-local", "--gpus", "1", "--catalog", str(FIXTURES / "catalog" / "tiny-cpu.toml")]
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == (
        "coral: error: $CORAL_ENGINE_SECRET: not an engine secret (expected hex digits)"
    )


def test_a_reused_host_keeps_every_engine_of_the_run() -> None:
    """A static host is given again after its instance was lost: the fleet keeps both engines (the first one's
    fault and server count are not overwritten)."""
    fleet = HostedFleet(VllmBackend({TINY_MODEL: "/nowhere"}, device="cpu"), HostTable())
    first, again = fleet("coral-local-1"), fleet("coral-local-1")
    first.fault = "the vLLM server i1.r0 (pid 7) on host coral-local-1 exited (killed by signal 9)"
    assert fleet.engines == {"coral-local-1": first, "coral-local-1.2": again}
    assert fleet.faults() == {"coral-local-1": first.fault}
