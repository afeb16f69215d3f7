"""A hosted engine's fault outlives its host's record: once the engine has seen its server exit, a worker
that registers again (a new record without the exit) does not make the engine healthy again; and the exit of a
server the engine stopped, or the goodbye of its host at the end of a run, is no fault."""

from __future__ import annotations

from coral.messages.hosts import ServerExited, WorkerHello
from coral.vllm.engine import VllmBackend
from coral.vllm.hosted import HostedEngine, HostTable, server_key
from coral.vllm.tiny import TINY_MODEL


def _engine(table: HostTable) -> HostedEngine:
    engine = HostedEngine(VllmBackend({TINY_MODEL: "/nowhere"}, device="cpu"), "n1", table)
    engine.hosts, engine.keys = ["h1"], [server_key("i1", 0)]  # as its launch plan over h1 sets them
    return engine


def test_an_exit_stays_the_engines_fault_after_the_worker_registers_again() -> None:
    table = HostTable()
    hello = WorkerHello("h1", "local", "cpu-local", 1, "127.0.0.1", "inc-1")
    table.register(hello, "host.h1")
    engine = _engine(table)
    assert engine.fault == ""
    table.exited(ServerExited("h1", "i1.r0", -9))
    want = "the vLLM server i1.r0 on host h1 exited (killed by signal 9)"
    assert engine.fault == want
    table.register(hello, "host.h1")  # the same worker again: the table keeps what it told
    assert table.hosts["h1"].exited == {"i1.r0": want}
    assert engine.fault == want
    table.register(WorkerHello("h1", "local", "cpu-local", 1, "127.0.0.1", "inc-2"), "host.h1")  # a new worker
    assert table.hosts["h1"].exited == {}
    assert engine.fault == want  # the engine keeps its fault: its node is lost


def test_an_unregistered_host_is_not_kept_as_a_fault() -> None:
    table = HostTable()
    engine = _engine(table)
    assert engine.fault == "host h1 is not registered"  # a resumed kernel hears from its workers later
    table.register(WorkerHello("h1", "local", "cpu-local", 1, "127.0.0.1", "inc-1"), "host.h1")
    assert engine.fault == ""


def test_a_stopped_engines_server_exit_and_host_goodbye_are_no_fault() -> None:
    table = HostTable()
    table.register(WorkerHello("h1", "local", "cpu-local", 1, "127.0.0.1", "inc-1"), "host.h1")
    engine = _engine(table)
    assert engine.stop(0.0) == 0
    table.exited(ServerExited("h1", "i1.r0", -15))  # the worker stopped the server as it was told
    table.lose("h1", "host worker h1 said goodbye")
    assert engine.fault == ""
    killed = _engine(table)  # a node the cloud kills: its loss is the node's, not an engine fault
    killed.kill()
    assert killed.fault == ""
