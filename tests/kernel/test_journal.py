"""The bus journal: write/read, reopen, torn-tail recovery and mid-file corruption."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import pytest

from coral.kernel import Fsync, Journal, JournalCorruptError, JournalError, TornTailWarning, encode, read_journal
from coral.kernel.journal import END_TAG, HEADER_SIZE, RECORD_HEAD, JournalEnd, journal_info

from .msgs import Ping


def _write(path: Path, n: int, fsync: Fsync = Fsync.BATCH, *, crash: bool = True) -> list[int]:
    """Append n Ping records; return the byte offset of each record. ``crash``: as a writer that died
    after the last of them (no end record)."""
    offsets = []
    with Journal.open(path, fsync=fsync) as j:
        for i in range(n):
            j.flush()
            offsets.append(path.stat().st_size)
            tag, body = encode(Ping(i))
            j.append(float(i) / 2, "send", "a", "b", tag.decode(), body)
        j.flush()
        end = path.stat().st_size
    if crash:
        with open(path, "r+b") as f:
            f.truncate(end)
    return offsets


def test_write_then_read(tmp_path: Path) -> None:
    path = tmp_path / "bus.journal"
    with Journal.open(path) as j:
        tag, body = encode(Ping(1))
        assert j.append(0.5, "send", "alice", "bob", tag.decode(), body) == 0
        assert j.append(1.0, "publish", "bob", "test.kernel.ping", tag.decode(), body) == 1
        assert j.append(1.5, "request", "bob", "alice", tag.decode(), body, corr=9) == 2
    records = list(read_journal(path))
    assert [r.seq for r in records] == [0, 1, 2]
    assert [(r.kind, r.source, r.dest, r.time, r.corr) for r in records] == [
        ("send", "alice", "bob", 0.5, 0),
        ("publish", "bob", "test.kernel.ping", 1.0, 0),
        ("request", "bob", "alice", 1.5, 9),
    ]
    assert all(r.decode() == Ping(1) for r in records)
    assert path.read_bytes()[:8] == b"CORALJNL"


@pytest.mark.parametrize("policy", list(Fsync))
def test_reopen_continues_sequence(tmp_path: Path, policy: Fsync) -> None:
    path = tmp_path / "j"
    _write(path, 3, policy)
    with Journal.open(path, fsync=policy) as j:
        assert j.torn_tail is None
        assert j.next_seq == 3
        j.append(9.0, "send", "a", "b", "test.kernel.ping", encode(Ping(3))[1])
    assert [r.seq for r in read_journal(path)] == [0, 1, 2, 3]


def test_torn_tail_is_truncated_with_warning(tmp_path: Path) -> None:
    path = tmp_path / "j"
    offsets = _write(path, 3)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 3)  # the writer died in the middle of record 2
    with pytest.warns(TornTailWarning) as caught:
        j = Journal.open(path)
    warning = caught[0].message
    assert isinstance(warning, TornTailWarning)
    assert warning.offset == offsets[2]
    assert warning.dropped_bytes == size - 3 - offsets[2]
    assert f"dropped {warning.dropped_bytes} bytes" in str(warning)
    assert j.torn_tail is not None and j.torn_tail.dropped_bytes == warning.dropped_bytes
    assert j.next_seq == 2
    j.append(3.0, "send", "a", "b", "test.kernel.ping", encode(Ping(9))[1])
    j.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.seq for r in read_journal(path)] == [0, 1, 2]
        assert list(read_journal(path))[-1].decode() == Ping(9)


def test_torn_inside_record_head_and_header(tmp_path: Path) -> None:
    path = tmp_path / "j"
    offsets = _write(path, 2)
    with open(path, "r+b") as f:
        f.truncate(offsets[1] + 5)
    with pytest.warns(TornTailWarning, match="dropped 5 bytes"):
        list(read_journal(path))  # the reader warns and stops, leaving the file alone
    assert path.stat().st_size == offsets[1] + 5
    with pytest.warns(TornTailWarning, match="dropped 5 bytes"):
        Journal.open(path).close()
    assert path.stat().st_size == offsets[1]

    short = tmp_path / "short"
    short.write_bytes(b"CORAL")
    with pytest.warns(TornTailWarning, match="dropped 5 bytes"):
        j = Journal.open(short)
    j.close()
    Journal.open(tmp_path / "fresh").close()
    assert short.read_bytes() == (tmp_path / "fresh").read_bytes()


def test_zero_filled_tail_is_torn(tmp_path: Path) -> None:
    path = tmp_path / "j"
    _write(path, 2)
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(bytes(4096))
    with pytest.warns(TornTailWarning, match="dropped 4096 bytes"):
        Journal.open(path).close()
    assert path.stat().st_size == size


def test_bad_checksum_in_the_middle_names_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "j"
    offsets = _write(path, 4)
    data = bytearray(path.read_bytes())
    data[offsets[1] + RECORD_HEAD.size + 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorruptError) as info:
        Journal.open(path)
    assert info.value.offset == offsets[1]
    assert f"offset {offsets[1]}" in str(info.value) and "checksum" in str(info.value)
    assert path.read_bytes() == bytes(data)  # nothing truncated
    with pytest.raises(JournalCorruptError) as info:
        list(read_journal(path))
    assert info.value.offset == offsets[1]


def test_bad_length_in_the_middle(tmp_path: Path) -> None:
    path = tmp_path / "j"
    offsets = _write(path, 3)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, offsets[1], 0xFFFFFFF0)
    path.write_bytes(bytes(data))
    with pytest.raises(JournalCorruptError, match=f"offset {offsets[1]}"):
        Journal.open(path)


def test_not_a_journal(tmp_path: Path) -> None:
    path = tmp_path / "j"
    path.write_bytes(b"SQLite format 3\x00" + bytes(100))
    with pytest.raises(JournalError, match="not a coral journal"):
        Journal.open(path)
    with pytest.raises(JournalError, match="is a directory"):
        Journal.open(tmp_path)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="batch"):
        Journal.open(tmp_path / "j", batch=0)
    with pytest.raises(JournalError, match="fsync"):
        Journal.open(tmp_path / "j", fsync="always")  # type: ignore[arg-type]
    with Journal.open(tmp_path / "j") as j, pytest.raises(JournalError, match="kind"):
        j.append(0.0, "shout", "a", "b", "t", b"")
    with pytest.raises(JournalError, match="closed"):
        j.append(0.0, "send", "a", "b", "t", b"")


def test_empty_journal_has_a_header_and_its_end(tmp_path: Path) -> None:
    path = tmp_path / "j"
    Journal.open(path).close()
    assert path.stat().st_size > HEADER_SIZE
    assert list(read_journal(path)) == []
    info = journal_info(path)
    assert info.complete and info.records == 0


def test_end_record_marks_a_complete_journal(tmp_path: Path) -> None:
    path = tmp_path / "j"
    offsets = _write(path, 3, crash=False)
    info = journal_info(path)
    assert info.complete and info.records == 3 and info.last_time == 1.0 and info.incomplete_reason() == ""
    assert [r.seq for r in read_journal(path)] == [0, 1, 2]  # the end record is not a message
    # opening and closing without writing changes nothing; writing moves the end record to the new end
    before = path.read_bytes()
    Journal.open(path).close()
    assert path.read_bytes() == before
    with Journal.open(path) as j:
        assert j.next_seq == 3
        j.append(5.0, "send", "a", "b", "test.kernel.ping", encode(Ping(3))[1])
        j.flush()
        assert not journal_info(path).complete  # while being written
    info = journal_info(path)
    assert info.complete and info.records == 4 and info.last_time == 5.0
    # cut at any record boundary: incomplete, with the reason in one line
    for cut in offsets[1:]:
        short = tmp_path / f"cut-{cut}"
        short.write_bytes(path.read_bytes()[:cut])
        info = journal_info(short)
        assert not info.complete
        assert (
            info.incomplete_reason().startswith("no end record after record") and "\n" not in info.incomplete_reason()
        )
    # a crashed writer's journal, reopened and closed without writing (as --resume checks it): still incomplete
    crashed = tmp_path / "crashed"
    _write(crashed, 2)
    Journal.open(crashed).close()
    assert not journal_info(crashed).complete


def test_record_after_the_end_record_is_corruption(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, 1, crash=False)
    offsets = _write(b, 2)
    tail = b.read_bytes()[offsets[1] :]
    bad = tmp_path / "bad"
    bad.write_bytes(a.read_bytes() + tail)
    with pytest.raises(JournalCorruptError, match="follows the journal's end record"):
        journal_info(bad)
    with pytest.raises(JournalCorruptError, match="follows the journal's end record"):
        Journal.open(bad)


def test_an_end_record_that_miscounts_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "j"
    _write(path, 2)
    with Journal.open(path) as j:
        tag, body = encode(JournalEnd(7))
        j.append(1.0, "publish", "kernel", END_TAG, tag.decode(), body)
        j.flush()
        size = path.stat().st_size
    with open(path, "r+b") as f:  # keep the forged end record as the last one
        f.truncate(size)
    with pytest.raises(JournalCorruptError, match="end record counts 7 records, not 2"):
        journal_info(path)
