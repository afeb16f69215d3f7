"""The message registry: every bus message is an ``attrs.frozen`` class registered under a stable short tag.

A tag is lower-case dotted words (``mkt.update``, ``kernel.actor.crashed``), at most 64 characters. The
tag is the wire name of the class and its pub/sub topic, so that a subscriber to ``kernel.actor.`` gets every
supervision event. Register with the decorator::

    @message("mkt.update")
    @attrs.frozen
    class MarketUpdate: ...

or with ``REGISTRY.register("mkt.update", MarketUpdate)``. A tag names one class for the life of the
process; registering the same class again under the same tag is a no-op.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import attrs
import msgspec

from coral.errors import CoralError

T = TypeVar("T")

TAG_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
MAX_TAG_LEN = 64


class RegistryError(CoralError):
    """A tag or class that cannot be registered or looked up."""


def check_tag(tag: str) -> str:
    """Return ``tag`` if it is a valid message tag; raise RegistryError naming the reason otherwise."""
    if not isinstance(tag, str):
        raise RegistryError(f"tag: expected str, got {type(tag).__name__}")
    if len(tag) > MAX_TAG_LEN:
        raise RegistryError(f"tag {tag!r}: longer than {MAX_TAG_LEN} characters")
    if not TAG_RE.match(tag):
        raise RegistryError(f"tag {tag!r}: must be lower-case dotted words like 'mkt.update'")
    return tag


class Registry:
    """A two-way map between tags and attrs message classes, with one cached msgpack decoder per class."""

    def __init__(self) -> None:
        self._by_tag: dict[str, type] = {}
        self._by_cls: dict[type, str] = {}
        self._by_tag_bytes: dict[bytes, type] = {}
        self._decoders: dict[type, msgspec.msgpack.Decoder[Any]] = {}
        self._lock = threading.Lock()

    def register(self, tag: str, cls: type) -> None:
        """Register ``cls`` under ``tag``; a tag or class already bound to something else is an error."""
        check_tag(tag)
        if not (isinstance(cls, type) and attrs.has(cls)):
            raise RegistryError(f"message {tag!r}: {cls!r} is not an attrs class")
        with self._lock:
            old = self._by_tag.get(tag)
            if old is cls:
                return
            if old is not None:
                raise RegistryError(f"tag {tag!r}: already registered to {old.__module__}.{old.__qualname__}")
            if cls in self._by_cls:
                raise RegistryError(f"class {cls.__qualname__}: already registered as {self._by_cls[cls]!r}")
            # Build the decoder now (msgspec checks the class's own annotations); a field type defined
            # later in the module (a forward reference) defers it to the first decode.
            try:
                self._decoders[cls] = msgspec.msgpack.Decoder(cls)
            except NameError:
                pass
            except (TypeError, ValueError) as exc:
                raise RegistryError(f"message {tag!r}: msgspec cannot decode {cls.__qualname__}: {exc}") from exc
            self._by_tag[tag] = cls
            self._by_cls[cls] = tag
            self._by_tag_bytes[tag.encode()] = cls

    def tag_of(self, cls: type) -> str:
        """The tag of a registered class."""
        try:
            return self._by_cls[cls]
        except KeyError:
            raise RegistryError(f"class {cls.__qualname__}: not a registered message type") from None

    def cls_of(self, tag: str) -> type:
        """The class registered under ``tag``."""
        try:
            return self._by_tag[tag]
        except KeyError:
            raise RegistryError(f"tag {tag!r}: no message type registered") from None

    def lookup_bytes(self, tag: bytes) -> type | None:
        """The class registered under the wire tag ``tag``, or None."""
        return self._by_tag_bytes.get(tag)

    def decoder(self, cls: type) -> msgspec.msgpack.Decoder[Any]:
        """The cached msgpack decoder of a registered class."""
        dec = self._decoders.get(cls)
        if dec is None:
            if cls not in self._by_cls:
                raise RegistryError(f"class {cls.__qualname__}: not a registered message type")
            try:
                dec = self._decoders[cls] = msgspec.msgpack.Decoder(cls)
            except (NameError, TypeError, ValueError) as exc:
                raise RegistryError(f"message {self._by_cls[cls]!r}: msgspec cannot decode it: {exc}") from exc
        return dec

    def tags(self) -> Iterator[str]:
        """All registered tags, in registration order."""
        return iter(list(self._by_tag))

    def __contains__(self, item: object) -> bool:
        return item in self._by_tag or item in self._by_cls

    def __len__(self) -> int:
        return len(self._by_tag)


REGISTRY = Registry()
"""The process-wide registry that ``@message`` fills and the bus uses by default."""


def message(tag: str, *, registry: Registry | None = None) -> Callable[[type[T]], type[T]]:
    """Class decorator: register an attrs class as a bus message under ``tag``."""
    check_tag(tag)
    reg = REGISTRY if registry is None else registry

    def deco(cls: type[T]) -> type[T]:
        reg.register(tag, cls)
        return cls

    return deco
