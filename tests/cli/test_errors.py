"""Every failure of the CLI is one line that names the file, address or flag, with a non-zero status, and
changes nothing; output paths are checked before any long work; a closed pipe ends quietly."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from coral.cli import EXIT_PIPE, main
from coral.errors import CoralError

from .conftest import Coral, Ran


def one_line(r: Ran, *needles: str, rc: int = 2) -> str:
    """The single stderr line of a failed run, after checking that it names each needle."""
    assert r.rc == rc, (r.rc, r.err)
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture
def listening() -> Iterator[int]:
    """A port that another process listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_second_up_names_the_address_and_suggests_bind(coral: Coral, listening: int, tmp_path: Path) -> None:
    address = f"tcp://127.0.0.1:{listening}"
    line = one_line(coral("up", "--bind", address, "--store", str(tmp_path / "s.sqlite")), address, "--bind")
    assert "another `coral up`" in line
    assert not (tmp_path / "s.sqlite").exists()


def test_pub_port_taken_too(coral: Coral, listening: int) -> None:
    one_line(coral("up", "--bind", f"tcp://127.0.0.1:{listening - 1}", "--no-build"), f":{listening}", "--bind")


def test_gateway_port_taken(coral: Coral, listening: int, tmp_path: Path) -> None:
    r = coral("up", "--bind", "inproc", "--gateway", str(listening), "--store", str(tmp_path / "s.sqlite"))
    one_line(r, "--gateway", f"127.0.0.1:{listening}")
    assert not (tmp_path / "s.sqlite").exists()


def test_record_into_a_missing_folder(coral: Coral, tmp_path: Path) -> None:
    journal = tmp_path / "missing-dir" / "x.journal"
    one_line(coral("up", "--bind", "inproc", "--record", str(journal)), "--record", str(journal), "does not exist")
    one_line(coral("up", "--bind", "inproc", "--record", str(tmp_path)), "--record", "is a folder")


def test_up_for_a_negative_duration(coral: Coral) -> None:
    one_line(coral("up", "--for", "-5s"), "--for", "must be positive", "-5s")
    one_line(coral("up", "--warmup", "-1"), "--warmup", "must be positive")


def test_simulate_checks_its_outputs_before_it_runs(
    coral: Coral, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the store does not exist: had the simulation started, the error would be about the store
    store = str(tmp_path / "none.sqlite")
    csv = tmp_path / "missing-dir" / "x.csv"
    one_line(coral("simulate", "--no-build", "--store", store, "--csv", str(csv)), "--csv", str(csv))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    one_line(
        coral("simulate", "--no-build", "--store", store, "--plot", str(tmp_path / "x.png")), "--plot", "matplotlib"
    )


def test_a_store_that_cannot_be_opened(coral: Coral, tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database")
    one_line(coral("templates", "list", "--store", str(junk)), str(junk), "not a Coral template store")
    one_line(coral("templates", "list", "--store", str(tmp_path)), str(tmp_path))
    a_file = tmp_path / "file"
    a_file.write_text("")
    one_line(coral("templates", "build", "--store", str(a_file / "s.sqlite"), "--nmax", "1"), str(a_file), rc=1)
    assert junk.read_text() == "not a database"


def test_keys_folder_with_open_modes(coral: Coral, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    assert coral("keys", "init", str(keys)).rc == 0  # the form that `coral keys list` suggests
    secret = keys / "server.key_secret"
    secret.chmod(0o644)
    one_line(coral("up", "--keys", str(keys), "--bind", "tcp://127.0.0.1:0"), str(secret), "chmod 600")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o644


def test_keys_suggests_a_command_that_works(coral: Coral, tmp_path: Path) -> None:
    keys = tmp_path / "k"
    line = one_line(coral("keys", "--dir", str(keys), "list"), str(keys))
    suggested = line.split("`")[1].split()
    assert suggested[:3] == ["coral", "keys", "init"]
    assert coral(*suggested[1:]).rc == 0
    assert coral("keys", "--dir", str(keys), "list").rc == 0


def test_plan_no_build_creates_nothing(coral: Coral, tmp_path: Path) -> None:
    store = tmp_path / "new" / "path.sqlite"
    line = one_line(coral("plan", "--no-build", "--store", str(store)), "--store", str(store))
    assert f"--store {store}" in line.split("`")[1]  # the hint builds where the command looks
    assert not store.parent.exists()


def test_plan_at_past_the_scenario(coral: Coral, tmp_path: Path) -> None:
    one_line(coral("plan", "--at", "999999", "--no-build", "--store", str(tmp_path / "s")), "--at", "3600")
    one_line(coral("plan", "--at", "-1", "--no-build", "--store", str(tmp_path / "s")), "--at")


def test_build_time_limit_refused_before_work(coral: Coral, tmp_path: Path) -> None:
    store = tmp_path / "s.sqlite"
    one_line(coral("templates", "build", "--time-limit", "-1", "--store", str(store)), "--time-limit", "-1")
    assert not store.exists()


def test_list_unknown_model(coral: Coral, tmp_path: Path) -> None:
    one_line(coral("templates", "list", "--model", "nope", "--store", str(tmp_path / "s")), "--model", "'nope'")


def test_bad_arguments_are_one_line(coral: Coral) -> None:
    one_line(coral("plan", "--policy", "nope"), "--policy", "nope")
    one_line(coral("simulate", "--seed", "x"), "--seed")
    one_line(coral("nope"), "nope")
    one_line(coral("keys"), "ACTION")


def test_errors_inside_task_groups_are_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import coral.cli.catalog_cmd as catalog_cmd

    def fail(_args: object) -> int:
        raise ExceptionGroup("tg", [ExceptionGroup("inner", [CoralError("--x: broken")])])

    monkeypatch.setattr(catalog_cmd, "run_catalog", fail)
    assert main(["catalog"]) == 2
    assert capsys.readouterr().err == "coral: error: --x: broken\n"

    def oserror(_args: object) -> int:
        raise FileNotFoundError(2, "No such file or directory", "/nowhere/x")

    monkeypatch.setattr(catalog_cmd, "run_catalog", oserror)
    assert main(["catalog"]) == 1
    assert capsys.readouterr().err == "coral: error: /nowhere/x: No such file or directory\n"


def test_a_closed_pipe_ends_quietly() -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: like `| head` after its lines
    try:
        p = subprocess.run(
            [sys.executable, "-c", "import sys, coral.cli; sys.exit(coral.cli.main())", "catalog", "regions", "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
    finally:
        os.close(write)
    assert p.returncode == EXIT_PIPE and p.stderr == ""


def test_a_journal_that_cannot_be_opened(coral: Coral, tmp_path: Path) -> None:
    missing = tmp_path / "none.journal"
    one_line(coral("up", "--bind", "inproc", "--resume", str(missing)), "--resume", str(missing))
    junk = tmp_path / "junk.journal"
    junk.write_bytes(b"not a journal")
    (tmp_path / "junk.journal.cloud.json").write_text("{}")
    one_line(coral("up", "--bind", "inproc", "--resume", str(junk)), str(junk), "not a coral journal")
    assert junk.read_bytes() == b"not a journal"
