"""Codec and registry: round trips of nested attrs messages, and decode errors that name tag and field."""

from __future__ import annotations

import attrs
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coral.kernel import REGISTRY, DecodeError, EncodeError, Registry, RegistryError, decode, encode, message
from coral.kernel.codec import Codec

from .msgs import Blob, Mode, Ping, Plan, Stage

PLAN = Plan(
    plan_id=7,
    mode=Mode.PREFILL,
    stages=(Stage("g6e.12xlarge", (0, 30), tp=4), Stage("p5.48xlarge", (30, 64), tp=8)),
    cost_per_h={"us-east-1": 41.5, "eu-west-1": 12.25},
    gap=0.001,
    note=None,
    tags=("a", "b"),
)


def test_round_trip_nested_optional_tuple_dict_enum() -> None:
    tag, body = encode(PLAN)
    assert tag == b"test.kernel.plan"
    back = decode(tag, body)
    assert back == PLAN
    assert isinstance(back.stages, tuple) and isinstance(back.stages[0], Stage)
    assert isinstance(back.stages[0].layers, tuple)
    assert back.mode is Mode.PREFILL
    assert back.note is None and back.gap == 0.001


def test_round_trip_defaults_omitted_on_the_wire_side() -> None:
    body = msgspec.msgpack.encode({"plan_id": 1, "mode": "decode", "stages": [], "cost_per_h": {}})
    back = decode(b"test.kernel.plan", body)
    assert back == Plan(1, Mode.DECODE, (), {})


stage_st = st.builds(
    Stage,
    st.text(min_size=1, max_size=8),
    st.tuples(st.integers(0, 200), st.integers(0, 200)),
    st.integers(1, 8),
)
plan_st = st.builds(
    Plan,
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from(Mode),
    st.tuples(*[stage_st] * 2) | st.just(()),
    st.dictionaries(st.text(max_size=6), st.floats(allow_nan=False)),
    st.none() | st.floats(allow_nan=False),
    st.none() | st.text(max_size=10),
    st.lists(st.text(max_size=4), max_size=3).map(tuple),
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, derandomize=True)
@given(plan_st)
def test_round_trip_property(plan: Plan) -> None:
    assert decode(*encode(plan)) == plan


def test_bytes_round_trip() -> None:
    blob = Blob(bytes(range(256)) * 200, seq=3)
    assert decode(*encode(blob)) == blob


def test_unknown_tag() -> None:
    with pytest.raises(DecodeError) as info:
        decode(b"test.kernel.nope", b"\x80")
    assert info.value.tag == "test.kernel.nope"
    assert "unknown tag" in str(info.value)


def test_non_utf8_tag_is_a_decode_error() -> None:
    with pytest.raises(DecodeError) as info:
        decode(b"\xff\xfe", b"\x80")
    assert "unknown tag" in info.value.reason


def test_wrong_field_type_names_tag_and_path() -> None:
    body = msgspec.msgpack.encode(
        {"plan_id": 1, "mode": "decode", "stages": [{"node": "n", "layers": [0, "x"]}], "cost_per_h": {}}
    )
    with pytest.raises(DecodeError) as info:
        decode(b"test.kernel.plan", body)
    err = info.value
    assert err.tag == "test.kernel.plan"
    assert err.path == "$.stages[0].layers[1]"
    assert "Expected `int`, got `str`" in err.reason
    assert "test.kernel.plan" in str(err) and "$.stages[0].layers[1]" in str(err)


def test_missing_field_and_bad_enum() -> None:
    with pytest.raises(DecodeError) as info:
        decode(b"test.kernel.plan", msgspec.msgpack.encode({"plan_id": 1, "mode": "decode", "stages": []}))
    assert "cost_per_h" in info.value.reason
    with pytest.raises(DecodeError) as info:
        decode(
            b"test.kernel.plan",
            msgspec.msgpack.encode({"plan_id": 1, "mode": "sideways", "stages": [], "cost_per_h": {}}),
        )
    assert info.value.path == "$.mode"


def test_malformed_body() -> None:
    with pytest.raises(DecodeError) as info:
        decode(b"test.kernel.ping", b"\xc1")
    assert info.value.tag == "test.kernel.ping"
    assert "malformed" in info.value.reason


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.sampled_from([b"test.kernel.plan", b"test.kernel.ping", b"kernel.ready", b"bogus"]), st.binary(max_size=64))
def test_random_bodies_only_raise_decode_error(tag: bytes, body: bytes) -> None:
    try:
        decode(tag, body)
    except DecodeError as exc:
        assert exc.tag == tag.decode()


def test_validator_failure_is_a_decode_error() -> None:
    reg = Registry()

    @message("test.kernel.positive", registry=reg)
    @attrs.frozen
    class Positive:
        x: int = attrs.field()

        @x.validator
        def _check(self, _attr: object, value: int) -> None:
            if value <= 0:
                raise ValueError("x must be > 0")

    codec = Codec(reg)
    assert codec.decode(*codec.encode(Positive(3))) == Positive(3)
    with pytest.raises(DecodeError) as info:
        codec.decode(b"test.kernel.positive", msgspec.msgpack.encode({"x": -1}))
    assert "x must be > 0" in info.value.reason


def test_registry_rejects_bad_input() -> None:
    reg = Registry()

    @attrs.frozen
    class A:
        x: int

    @attrs.frozen
    class B:
        x: int

    reg.register("test.a", A)
    reg.register("test.a", A)  # same class again: a no-op
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("test.a", B)
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("test.b", A)
    with pytest.raises(RegistryError, match="lower-case dotted"):
        reg.register("Test.A", B)
    with pytest.raises(RegistryError, match="longer than"):
        reg.register("a" * 65, B)
    with pytest.raises(RegistryError, match="not an attrs class"):
        reg.register("test.c", dict)
    with pytest.raises(RegistryError, match="no message type"):
        reg.cls_of("test.zzz")
    assert reg.cls_of("test.a") is A and reg.tag_of(A) == "test.a" and "test.a" in reg and len(reg) == 1


@attrs.frozen
class Outer:
    inner: Inner  # defined below: a forward reference, resolved at the first decode


@attrs.frozen
class Inner:
    x: int


def test_forward_reference_resolves_at_first_decode() -> None:
    reg = Registry()
    reg.register("test.outer", Outer)
    codec = Codec(reg)
    assert codec.decode(*codec.encode(Outer(Inner(2)))) == Outer(Inner(2))


def test_encode_unregistered_type() -> None:
    @attrs.frozen
    class Loose:
        x: int

    with pytest.raises(EncodeError, match="not a registered message type"):
        encode(Loose(1))


def test_default_registry_holds_kernel_and_test_messages() -> None:
    assert REGISTRY.tag_of(Ping) == "test.kernel.ping"
    assert "kernel.actor.crashed" in set(REGISTRY.tags())
