"""The wire codec: a message travels as two frames, its tag (UTF-8) and its msgpack body (msgspec).

``encode(msg)`` gives ``(tag, body)``; ``decode(tag, body)`` gives the message back, using the registry's
cached ``msgspec.msgpack.Decoder(cls)`` for the tag's class (msgspec cannot decode a union of attrs
classes, hence one decoder per tag). Anything that fails to decode, whatever the bytes, raises
``DecodeError`` carrying the tag and the path msgspec reports (``$.inner.x``); nothing else escapes.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from coral.errors import CoralError
from coral.kernel.registry import REGISTRY, Registry

_PATH_RE = re.compile(r" - at `([^`]*)`$")


class DecodeError(CoralError):
    """A frame pair that is not a valid message: unknown tag, malformed body or a wrong field type."""

    def __init__(self, tag: str, reason: str, path: str | None = None) -> None:
        self.tag = tag
        self.reason = reason
        self.path = path
        where = f" at {path}" if path else ""
        super().__init__(f"message {tag!r}{where}: {reason}")


class EncodeError(CoralError):
    """A message that cannot be put on the wire (unregistered type or an unencodable field)."""


def tag_text(tag: bytes) -> str:
    """A printable form of a wire tag, valid UTF-8 or not."""
    try:
        return tag.decode()
    except UnicodeDecodeError:
        return repr(tag)


class Codec:
    """Encodes registered attrs messages to (tag, body) frames and decodes them back."""

    def __init__(self, registry: Registry = REGISTRY) -> None:
        self.registry = registry
        self._encoder = msgspec.msgpack.Encoder()
        self._tag_bytes: dict[type, bytes] = {}

    def tag_bytes(self, cls: type) -> bytes:
        """The wire tag of a registered class."""
        tag = self._tag_bytes.get(cls)
        if tag is None:
            try:
                tag = self.registry.tag_of(cls).encode()
            except CoralError as exc:
                raise EncodeError(str(exc)) from None
            self._tag_bytes[cls] = tag
        return tag

    def encode(self, msg: object) -> tuple[bytes, bytes]:
        """Return the (tag, body) frames of a registered message."""
        tag = self.tag_bytes(type(msg))
        try:
            return tag, self._encoder.encode(msg)
        except (TypeError, ValueError, OverflowError) as exc:
            raise EncodeError(f"message {tag.decode()!r}: cannot encode: {exc}") from exc

    def decode(self, tag: bytes, body: bytes | memoryview) -> Any:
        """Decode a (tag, body) frame pair; raise DecodeError on any failure."""
        cls = self.registry.lookup_bytes(tag)
        if cls is None:
            raise DecodeError(tag_text(tag), "unknown tag")
        try:
            return self.registry.decoder(cls).decode(body)
        except msgspec.ValidationError as exc:
            text = str(exc)
            m = _PATH_RE.search(text)
            if m:
                raise DecodeError(tag_text(tag), text[: m.start()], m.group(1)) from None
            raise DecodeError(tag_text(tag), text) from None
        except msgspec.DecodeError as exc:
            raise DecodeError(tag_text(tag), str(exc)) from None
        except Exception as exc:  # a post-init hook or a validator with its own exception type
            raise DecodeError(tag_text(tag), f"{type(exc).__name__}: {exc}") from None


DEFAULT_CODEC = Codec(REGISTRY)


def encode(msg: object) -> tuple[bytes, bytes]:
    """Encode with the default registry."""
    return DEFAULT_CODEC.encode(msg)


def decode(tag: bytes, body: bytes | memoryview) -> Any:
    """Decode with the default registry."""
    return DEFAULT_CODEC.decode(tag, body)
