"""The journal's crash guarantees, on random damage: a torn tail at any byte is truncated with a warning
naming the bytes dropped; a damaged byte in any record but the last is an error naming that record's
offset, and changes nothing."""

from __future__ import annotations

import bisect
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coral.kernel import Journal, JournalCorruptError, TornTailWarning, encode, read_journal
from coral.kernel.journal import HEADER_SIZE, journal_info

from .msgs import Ping

N = 12


def _write(path: Path) -> list[int]:
    """N records of varying size; the offsets of each record, of the end record and of the end."""
    offsets = []
    with Journal.open(path) as j:
        for i in range(N):
            j.flush()
            offsets.append(path.stat().st_size)
            tag, body = encode(Ping(i * 7919))
            j.append(float(i), "publish", "a", "test.kernel.ping", tag.decode(), body)
        j.flush()
        offsets.append(path.stat().st_size)
    offsets.append(path.stat().st_size)
    return offsets


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[int]]:
    path = tmp_path_factory.mktemp("jnl") / "j"
    offsets = _write(path)
    return path.read_bytes(), offsets


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_torn_tail_at_a_random_byte(tmp_path: Path, pristine: tuple[bytes, list[int]], data: st.DataObject) -> None:
    blob, offsets = pristine
    cut = data.draw(st.integers(HEADER_SIZE + 1, len(blob) - 1), label="cut")
    path = tmp_path / f"torn-{cut}"
    path.write_bytes(blob[:cut])
    whole = bisect.bisect_right(offsets, cut) - 1  # records wholly before the cut
    boundary = offsets[whole]
    if cut == boundary:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            j = Journal.open(path)
    else:
        with pytest.warns(TornTailWarning, match=f"dropped {cut - boundary} bytes") as caught:
            j = Journal.open(path)
        w = caught[0].message
        assert isinstance(w, TornTailWarning) and w.offset == boundary and w.dropped_bytes == cut - boundary
    assert j.next_seq == whole
    j.close()
    assert path.stat().st_size == boundary
    assert [r.seq for r in read_journal(path)] == list(range(whole))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damage_in_the_middle_names_the_offset(
    tmp_path: Path, pristine: tuple[bytes, list[int]], data: st.DataObject
) -> None:
    blob, offsets = pristine
    pos = data.draw(st.integers(offsets[0], offsets[N - 1] - 1), label="pos")  # any byte but the last record's
    flip = data.draw(st.integers(1, 255), label="xor")
    damaged = bytearray(blob)
    damaged[pos] ^= flip
    path = tmp_path / f"bad-{pos}-{flip}"
    path.write_bytes(bytes(damaged))
    record = offsets[bisect.bisect_right(offsets, pos) - 1]
    with pytest.raises(JournalCorruptError) as info:
        Journal.open(path)
    assert info.value.offset == record and f"offset {record}" in str(info.value)
    assert path.read_bytes() == bytes(damaged)  # nothing truncated, nothing skipped
    with pytest.raises(JournalCorruptError):
        list(read_journal(path))


def test_a_cut_at_any_record_boundary_is_incomplete(tmp_path: Path, pristine: tuple[bytes, list[int]]) -> None:
    blob, offsets = pristine
    whole = tmp_path / "whole"
    whole.write_bytes(blob)
    assert journal_info(whole).complete
    for k, cut in enumerate(offsets[:-1]):
        path = tmp_path / f"cut-{cut}"
        path.write_bytes(blob[:cut])
        info = journal_info(path)
        assert not info.complete and info.records == k and info.torn is None
        assert info.incomplete_reason().startswith("no end record")
