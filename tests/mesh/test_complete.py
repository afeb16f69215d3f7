"""Complete journals: a run's journal ends with its end record; one cut at a record boundary is reported
as incomplete by ``coral replay`` and ``coral up --resume``; a torn tail or a corrupt record is one
clean line; ``--resume`` compares the saved provider state with the journal and says how it reconciles
them, or refuses one of another run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import coral.cli
from actors.compose import run_mesh
from actors.recovery import RecoveryError, check_provider, fleet_state, load_recovery, provider_state_path
from coral.kernel import read_journal
from coral.kernel.journal import HEADER_SIZE, RECORD_HEAD, _encoder, journal_info
from tests.conftest import shared_build

from .helpers import SCENARIOS, World, journal_path


def boundaries(path: Path) -> list[int]:
    """Byte offsets where each record starts, and the end."""
    out = [HEADER_SIZE]
    for r in read_journal(path):
        payload = _encoder.encode((r.seq, r.time, r.kind, r.source, r.dest, r.tag, r.body, r.corr))
        out.append(out[-1] + RECORD_HEAD.size + len(payload))
    return out


def before_provider(path: Path) -> int:
    """The last record boundary before the provider's last action (a journal cut there lost what the
    provider did after it)."""
    at = json.loads(provider_state_path(path).read_text())["at"]
    times = [r.time for r in read_journal(path)]
    offs = boundaries(path)
    k = max(i for i, t in enumerate(times) if t < at)
    return offs[k]


def cut_copy(src: Path, dst: Path, at: int) -> Path:
    dst.write_bytes(src.read_bytes()[:at])
    return dst


@pytest.fixture(scope="module")
def recorded(world: World, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mesh-steady recorded for 60 s with its provider state, as `coral up --record` keeps it."""
    import anyio

    def record(path: Path) -> None:
        sc = world.scenario("mesh-steady")
        setup = world.setup("mesh-steady")

        async def go() -> None:
            await run_mesh(setup, sc, world.catalog, world.perf, journal=path, until=60.0,
                           provider_state=provider_state_path(path))  # fmt: skip

        anyio.run(go)

    return shared_build(tmp_path_factory, "complete-run.journal", record)


@pytest.mark.parametrize("name", SCENARIOS)
def test_bundled_journals_are_complete(name: str) -> None:
    info = journal_info(journal_path(name))
    assert info.complete, info.incomplete_reason()


def test_a_run_ends_its_journal_and_a_cut_one_is_incomplete(recorded: Path, tmp_path: Path) -> None:
    info = journal_info(recorded)
    assert info.complete and any(r.tag == "mesh.end" for r in read_journal(recorded))
    offs = boundaries(recorded)
    for at in [*offs[1 :: max(1, len(offs) // 25)], offs[-1]]:  # the last: everything but the end record
        info = journal_info(cut_copy(recorded, tmp_path / "cut.journal", at))
        assert not info.complete and info.incomplete_reason().startswith("no end record after record")


def test_replay_reports_an_incomplete_journal(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    offs = boundaries(recorded)
    cut = cut_copy(recorded, tmp_path / "cut.journal", offs[len(offs) // 5])
    capsys.readouterr()
    assert coral.cli.main(["replay", str(cut)]) == 3
    out = capsys.readouterr().out
    assert "replay matches" in out and "journal incomplete: no end record after record" in out
    assert "differs" not in out
    assert coral.cli.main(["replay", str(cut), "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and not doc["complete"] and doc["incomplete"].startswith("no end record")


def test_replay_torn_and_corrupt_journals_get_one_clean_line(
    recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    offs = boundaries(recorded)
    torn = cut_copy(recorded, tmp_path / "torn.journal", offs[len(offs) // 5] + 7)
    capsys.readouterr()
    assert coral.cli.main(["replay", str(torn)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"coral replay: warning: {torn}: torn tail at byte offset {offs[len(offs) // 5]}: dropped 7 bytes"]
    bad = tmp_path / "bad.journal"
    data = bytearray(recorded.read_bytes())
    data[offs[3] + RECORD_HEAD.size + 1] ^= 0x5A
    bad.write_bytes(bytes(data))
    assert coral.cli.main(["replay", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"coral: error: {bad}: corrupt record at byte offset {offs[3]}: checksum mismatch"]


def test_resume_compares_the_provider_state_with_the_journal(recorded: Path, tmp_path: Path) -> None:
    cut = cut_copy(recorded, tmp_path / "run.journal", before_provider(recorded))
    state = provider_state_path(cut)
    shutil.copy(provider_state_path(recorded), state)
    rec = load_recovery(cut)
    assert not rec.complete
    check = check_provider(rec.fleet, state)
    assert check.newer and check.provider_at is not None and check.provider_at > check.journal_at
    line = check.describe("release")
    assert "is newer than the journal's last record" in line and "reconciling:" in line and "\n" not in line
    # the whole journal and its own state agree
    same = check_provider(fleet_state(read_journal(recorded)), provider_state_path(recorded))
    assert same.matches and same.describe("adopt").startswith("provider state matches the journal")
    # a provider state of another run is refused, in one line; so is an unreadable one
    doc = json.loads(state.read_text())
    doc["nodes"].append({"id": "n999", "region": "aws-us-east-1", "node": "g6.xlarge", "ready_at": 0.0,
                         "state": "running", "tags": {"coral.deployment": "ghost-70b"}})  # fmt: skip
    state.write_text(json.dumps(doc))
    with pytest.raises(RecoveryError, match=r"refused: node\(s\) n999 serve deployments that the journal's run"):
        check_provider(rec.fleet, state)
    state.write_text("{not json")
    with pytest.raises(RecoveryError, match="unreadable provider state: JSONDecodeError") as info:
        check_provider(rec.fleet, state)
    assert "\n" not in str(info.value)


@pytest.mark.slow
def test_resume_of_a_cut_journal_says_so(
    world: World, recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut = cut_copy(recorded, tmp_path / "run.journal", before_provider(recorded))
    shutil.copy(provider_state_path(recorded), provider_state_path(cut))
    capsys.readouterr()
    args = ["up", "--resume", str(cut), "--store", str(world.store), "--no-build", "--speed", "max",
            "--bind", "inproc", "--json", "--for", "5s"]  # fmt: skip
    assert coral.cli.main(args) == 0
    out = capsys.readouterr()
    lines = [x for x in out.err.splitlines() if x.startswith("coral up: --resume:")]
    assert len(lines) == 2 and "is incomplete (no end record after record" in lines[0]
    assert "newer than the journal's last record" in lines[1]
    summary = json.loads(out.out)
    assert summary["resumed"]["journal_complete"] is False
    assert summary["resumed"]["provider"]["newer_than_journal"] is True
