"""The bus journal: write/read, reopen, torn-tail recovery and mid-file corruption."""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import pytest

from coral.kernel import Fsync, Journal, JournalCorruptError, JournalError, TornTailWarning, encode, read_journal
from coral.kernel.journal import HEADER_SIZE, RECORD_HEAD

from .msgs import Ping


def _write(path: Path, n: int, fsync: Fsync = Fsync.BATCH) -> list[int]:
    """Append n Ping records; return the byte offset of each record."""
    offsets = []
    with Journal.open(path, fsync=fsync) as j:
        for i in range(n):
            j.flush()
            offsets.append(path.stat().st_size)
            tag, body = encode(Ping(i))
            j.append(float(i) / 2, "send", "a", "b", tag.decode(), body)
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


def test_empty_journal_has_only_a_header(tmp_path: Path) -> None:
    path = tmp_path / "j"
    Journal.open(path).close()
    assert path.stat().st_size == HEADER_SIZE
    assert list(read_journal(path)) == []
