"""The bus journal: an append-only binary file of every message routed through the kernel.

File format (all integers little-endian)::

    file    := header record*
    header  := b"CORALJNL" (8 bytes) | version u32 (= 1)                      -- 12 bytes
    record  := length u32 | crc32 u32 | payload (length bytes)
    payload := msgpack array [seq, time, kind, source, dest, tag, body, corr]

``length`` counts the payload only and is never 0; ``crc32`` is ``zlib.crc32(payload)``. In the payload,
``seq`` (int) numbers records from 0 without gaps, also across reopenings; ``time`` (float) is the kernel
clock's ``now()`` when the kernel routed the message; ``kind`` is ``send``, ``request``, ``reply`` or
``publish``; ``source`` is the sender's name (``kernel`` for the kernel's own events); ``dest`` is the
destination name for directed kinds and the topic for ``publish``; ``tag`` is the message tag; ``body``
(bin) is the msgpack body exactly as it travelled; ``corr`` (int) is the request id for ``request`` and
``reply``, else 0.

End: ``close()`` appends one last record, ``JournalEnd`` (tag ``kernel.journal.end``, its ``records`` the
number of records before it), so a journal that ends anywhere else (a crash, a copy cut at a record
boundary, a lost tail) is known to be incomplete. ``read_journal`` does not yield it; ``journal_info``
says whether a journal is complete. Appending to a complete journal drops its end record first (the
journal goes on, and gets a new one when closed again); an end record anywhere but last is corruption.

Recovery: a file whose last record is incomplete (the writer died mid-record), or whose tail is all zero
bytes, is *torn* (an incomplete record followed by a whole checksummed one is damage, not a torn tail).
``Journal.open`` truncates a torn file after the last whole record and reports a ``TornTailWarning`` that says
how many bytes were dropped (``journal.torn_tail``, also issued with ``warnings.warn``). A whole record whose
checksum fails, whose payload does not decode, or whose length is 0 (with non-zero bytes after it) or beyond
``MAX_RECORD`` is corruption: opening or reading raises ``JournalCorruptError`` naming the byte offset of the
bad record. ``read_journal`` never modifies the file: it stops at a torn tail with a warning.

Durability (``Fsync``): ``ALWAYS`` fsyncs after each record; ``BATCH`` fsyncs every ``batch`` records and
on ``sync()``/``close()``; ``NEVER`` leaves it to the OS. ``flush()`` hands buffered records to the OS (they
survive a crash of the process, not of the machine); the kernel calls it whenever it goes idle.
"""

from __future__ import annotations

import enum
import os
import struct
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import attrs
import msgspec

from coral.errors import CoralError
from coral.kernel.codec import DEFAULT_CODEC, Codec
from coral.kernel.registry import message

MAGIC = b"CORALJNL"
VERSION = 1
HEADER = MAGIC + struct.pack("<I", VERSION)
HEADER_SIZE = len(HEADER)
RECORD_HEAD = struct.Struct("<II")
MAX_RECORD = 64 * 1024 * 1024
KINDS = ("send", "request", "reply", "publish")

END_TAG = "kernel.journal.end"
_Payload = tuple[int, float, str, str, str, str, bytes, int]
_payload_decoder = msgspec.msgpack.Decoder(_Payload)
_encoder = msgspec.msgpack.Encoder()


class JournalError(CoralError):
    """A journal file that cannot be opened or written."""


class JournalCorruptError(JournalError):
    """A record in the middle of a journal fails its checksum or does not decode."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(f"{path}: corrupt record at byte offset {offset}: {reason}")


class TornTailWarning(UserWarning):
    """The journal ended inside a record; the incomplete tail was (or would be) dropped."""

    def __init__(self, path: Path, offset: int, dropped_bytes: int) -> None:
        self.path = path
        self.offset = offset
        self.dropped_bytes = dropped_bytes
        super().__init__(f"{path}: torn tail at byte offset {offset}: dropped {dropped_bytes} bytes")


@message(END_TAG)
@attrs.frozen
class JournalEnd:
    """The last record of a journal that was closed: ``records`` came before it."""

    records: int


@attrs.frozen
class JournalInfo:
    """What ``journal_info`` found: the records (the end record not counted), the last record's kernel
    time, whether the journal ends with its end record, and a torn tail if any."""

    path: Path
    records: int
    last_time: float
    complete: bool
    torn: TornTailWarning | None = None

    def incomplete_reason(self) -> str:
        """Why the journal is incomplete, in a few words ("" when complete)."""
        if self.complete:
            return ""
        if self.torn is not None:
            return f"torn tail at byte offset {self.torn.offset} ({self.torn.dropped_bytes} bytes dropped)"
        return (
            f"no end record after record {self.records - 1} (t={self.last_time:g} s): cut short or still being written"
        )


class Fsync(enum.Enum):
    """When the journal forces records to stable storage."""

    ALWAYS = "always"
    BATCH = "batch"
    NEVER = "never"


@attrs.frozen
class JournalRecord:
    """One routed message, as stored."""

    seq: int
    time: float
    kind: str
    source: str
    dest: str
    tag: str
    body: bytes
    corr: int = 0

    def decode(self, codec: Codec = DEFAULT_CODEC) -> Any:
        """The message this record carries (raises DecodeError if its tag or body is unknown or bad)."""
        return codec.decode(self.tag.encode(), self.body)


class _Walker:
    """Reads records in order from an open file; after iteration, ``torn_at`` is set if the tail is torn."""

    def __init__(self, path: Path, f: IO[bytes]) -> None:
        self.path = path
        self.f = f
        self.torn_at: int | None = None
        self.size = 0
        self.end_at: int | None = None  # byte offset of the end record, when it is the last record
        self.ended: JournalEnd | None = None

    def _torn(self, pos: int) -> None:
        self.torn_at = pos
        self.size = self.f.seek(0, os.SEEK_END)

    def __iter__(self) -> Iterator[JournalRecord]:
        p, f = self.path, self.f
        f.seek(0)
        head = f.read(HEADER_SIZE)
        if len(head) < HEADER_SIZE:
            if not HEADER.startswith(head):
                raise JournalError(f"{p}: not a coral journal (bad header)")
            if head:
                self._torn(0)
            return
        if head[: len(MAGIC)] != MAGIC:
            raise JournalError(f"{p}: not a coral journal (bad magic {head[: len(MAGIC)]!r})")
        if head != HEADER:
            (version,) = struct.unpack_from("<I", head, len(MAGIC))
            raise JournalError(f"{p}: journal version {version} is not supported (expected {VERSION})")
        pos = HEADER_SIZE
        while True:
            rh = f.read(RECORD_HEAD.size)
            if not rh:
                return
            if len(rh) < RECORD_HEAD.size:
                self._torn(pos)
                return
            length, crc = RECORD_HEAD.unpack(rh)
            if length == 0:
                if not any(rh) and _rest_is_zero(f):
                    self._torn(pos)
                    return
                raise JournalCorruptError(p, pos, "zero record length")
            if length > MAX_RECORD:
                raise JournalCorruptError(p, pos, f"record length {length} exceeds {MAX_RECORD}")
            payload = f.read(length)
            if len(payload) < length:
                later = _whole_record_after(f, pos)
                if later is not None:
                    raise JournalCorruptError(
                        p, pos, f"record length {length} runs past the end, but a whole record follows at {later}"
                    )
                self._torn(pos)
                return
            if zlib.crc32(payload) != crc:
                raise JournalCorruptError(p, pos, "checksum mismatch")
            rec = _decode_payload(p, pos, payload)
            if self.end_at is not None:
                raise JournalCorruptError(p, pos, f"record {rec.seq} follows the journal's end record")
            if rec.tag == END_TAG:
                self.end_at, self.ended = pos, _decode_end(p, pos, rec)
            else:
                yield rec
            pos += RECORD_HEAD.size + length


def _whole_record_after(f: IO[bytes], pos: int) -> int | None:
    """The offset of a whole, checksummed record that starts after ``pos``, if any.

    A torn tail is a prefix of the one record being written when the writer died: no whole record can
    follow it. A damaged length field in the middle of a file looks like a torn tail, but whole records
    follow it: that is corruption, not a tail to truncate.
    """
    end = f.seek(0, os.SEEK_END)
    if end - pos > RECORD_HEAD.size + MAX_RECORD:
        return pos + 1  # longer than any record: the tail cannot be one torn record
    f.seek(pos)
    tail = f.read()
    head = RECORD_HEAD
    for q in range(1, len(tail) - head.size):
        length, crc = head.unpack_from(tail, q)
        start = q + head.size
        if 0 < length <= len(tail) - start and zlib.crc32(tail[start : start + length]) == crc:
            return pos + q
    return None


def _rest_is_zero(f: IO[bytes]) -> bool:
    while chunk := f.read(1 << 16):
        if any(chunk):
            return False
    return True


def _decode_end(path: Path, offset: int, rec: JournalRecord) -> JournalEnd:
    try:
        end = rec.decode()
    except CoralError as exc:
        raise JournalCorruptError(path, offset, f"bad end record: {exc}") from None
    if not isinstance(end, JournalEnd) or end.records != rec.seq:
        raise JournalCorruptError(
            path, offset, f"end record counts {getattr(end, 'records', '?')} records, not {rec.seq}"
        )
    return end


def _decode_payload(path: Path, offset: int, payload: bytes) -> JournalRecord:
    try:
        seq, t, kind, source, dest, tag, body, corr = _payload_decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise JournalCorruptError(path, offset, f"bad payload: {exc}") from None
    return JournalRecord(seq, t, kind, source, dest, tag, body, corr)


class Journal:
    """An open journal, appending records; create with ``Journal.open(path)``."""

    def __init__(self, path: Path, f: IO[bytes], next_seq: int, fsync: Fsync, batch: int) -> None:
        self.path = path
        self._f = f
        self.next_seq = next_seq
        self.fsync = fsync
        self.batch = batch
        self.torn_tail: TornTailWarning | None = None
        self.last_time = 0.0
        self._end_at: int | None = None  # the end record of a closed journal, dropped at the first append
        self._fresh = False
        self._appended = False
        self._unsynced = 0
        self._closed = False

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, fsync: Fsync = Fsync.BATCH, batch: int = 1000) -> Journal:
        """Open (creating if absent) a journal for appending, truncating a torn tail with a warning."""
        if not isinstance(fsync, Fsync):
            raise JournalError(f"fsync: expected an Fsync policy, got {fsync!r}")
        if not isinstance(batch, int) or batch < 1:
            raise JournalError(f"batch: expected an int >= 1, got {batch!r}")
        p = Path(path)
        if p.is_dir():
            raise JournalError(f"{p}: is a directory, not a journal file")
        try:
            f = open(p, "r+b" if p.exists() else "w+b")  # noqa: SIM115 - the Journal owns the file
        except OSError as exc:
            raise JournalError(f"{p}: cannot open journal: {exc.strerror}") from exc
        try:
            walker = _Walker(p, f)
            last_seq: int | None = None
            last_time = 0.0
            for rec in walker:
                last_seq, last_time = rec.seq, rec.time
            torn: TornTailWarning | None = None
            end = f.tell()
            if walker.torn_at is not None:
                end = walker.torn_at
                torn = TornTailWarning(p, end, walker.size - end)
                f.truncate(end)
            if end == 0:
                f.seek(0)
                f.write(HEADER)
                f.flush()
                os.fsync(f.fileno())
            f.seek(0, os.SEEK_END)
        except BaseException:
            f.close()
            raise
        journal = cls(p, f, 0 if last_seq is None else last_seq + 1, fsync, batch)
        journal.last_time = last_time
        journal._end_at = walker.end_at
        journal._fresh = end == 0
        if torn is not None:
            journal.torn_tail = torn
            warnings.warn(torn, stacklevel=2)
        return journal

    def append(
        self,
        time: float,
        kind: str,
        source: str,
        dest: str,
        tag: str,
        body: bytes | memoryview,
        corr: int = 0,
    ) -> int:
        """Append one record and return its sequence number."""
        if self._closed:
            raise JournalError(f"{self.path}: journal is closed")
        if kind not in KINDS:
            raise JournalError(f"kind: expected one of {KINDS}, got {kind!r}")
        if self._end_at is not None:  # a closed journal goes on
            self._f.truncate(self._end_at)
            self._f.seek(self._end_at)
            self._end_at = None
        seq = self.next_seq
        payload = _encoder.encode((seq, time, kind, source, dest, tag, body, corr))
        if len(payload) > MAX_RECORD:
            raise JournalError(f"{self.path}: record for {tag!r} is {len(payload)} bytes (max {MAX_RECORD})")
        # One write per record: the buffered file flushes whole writes, so a writer killed between two
        # flushes leaves whole records (two writes left the 8-byte head alone on disk as a torn tail).
        self._f.write(RECORD_HEAD.pack(len(payload), zlib.crc32(payload)) + payload)
        self.next_seq = seq + 1
        self.last_time = time
        self._appended = True
        if self.fsync is Fsync.ALWAYS:
            self.sync()
        elif self.fsync is Fsync.BATCH:
            self._unsynced += 1
            if self._unsynced >= self.batch:
                self.sync()
        return seq

    def flush(self) -> None:
        """Hand buffered records to the OS."""
        if not self._closed:
            self._f.flush()

    def sync(self) -> None:
        """Flush and fsync (unless the policy is NEVER)."""
        if self._closed:
            return
        self._f.flush()
        if self.fsync is not Fsync.NEVER:
            os.fsync(self._f.fileno())
        self._unsynced = 0

    def close(self) -> None:
        """Append the end record (when this session created the file or wrote to it), sync and close;
        further appends raise. Opening and closing a crashed journal leaves it incomplete."""
        if self._closed:
            return
        if self._appended or self._fresh:
            tag, body = DEFAULT_CODEC.encode(JournalEnd(self.next_seq))
            self.append(self.last_time, "publish", "kernel", END_TAG, tag.decode(), body)
        self.sync()
        self._closed = True
        self._f.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_journal(path: str | os.PathLike[str]) -> Iterator[JournalRecord]:
    """Iterate the records of a journal file in order, without modifying it.

    Raises JournalCorruptError at a bad record; at a torn tail, warns TornTailWarning and stops.
    """
    p = Path(path)
    try:
        f = open(p, "rb")  # noqa: SIM115 - closed in the finally below, across yields
    except OSError as exc:
        raise JournalError(f"{p}: cannot open journal: {exc.strerror}") from exc
    try:
        walker = _Walker(p, f)
        yield from walker
        if walker.torn_at is not None:
            warnings.warn(TornTailWarning(p, walker.torn_at, walker.size - walker.torn_at), stacklevel=2)
    finally:
        f.close()


def journal_info(path: str | os.PathLike[str]) -> JournalInfo:
    """Read a journal through, without modifying it: its record count, last time, and whether it is
    complete (ends with its end record). Raises JournalCorruptError at a bad record."""
    p = Path(path)
    try:
        f = open(p, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise JournalError(f"{p}: cannot open journal: {exc.strerror}") from exc
    with f:
        walker = _Walker(p, f)
        n, last = 0, 0.0
        for rec in walker:
            n, last = n + 1, rec.time
        torn = None
        if walker.torn_at is not None:
            torn = TornTailWarning(p, walker.torn_at, walker.size - walker.torn_at)
        return JournalInfo(p, n, last, walker.ended is not None and torn is None, torn)
