"""Load the catalog: the bundled TOML files, then user files that add to or override them.

A catalog file holds arrays of tables: ``[[gpu]]``, ``[[node]]``, ``[[region]]`` (with
``[region.offers."<node type>"]`` sub-tables) and ``[[model]]``. The four bundled files in ``data/``
load first, then each user file in the order given. In a user file, an entry whose name already exists
must say what it does:

- ``override = true`` replaces the earlier entry entirely;
- ``extend = true`` changes only the fields it gives. For a region this adds offers, or changes single
  fields of offers it already has (e.g. only ``availability = 0`` to model a stock-out).

Without either flag, a name that already exists is an error; a name defined twice in one file is always
an error. Every problem raises one `CatalogError` that names the file, the entry (table kind and name,
or its position), the field and the reason, and nothing is returned.
"""

from __future__ import annotations

import difflib
import math
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from coral.catalog.types import Catalog, GpuType, ModelArch, NodeType, Offer, Region
from coral.errors import CoralError

__all__ = ["BUILTIN_FILES", "DATA_DIR", "CatalogError", "catalog_to_dict", "load_catalog"]

DATA_DIR = Path(__file__).parent / "data"
BUILTIN_FILES: tuple[Path, ...] = tuple(
    DATA_DIR / f for f in ("gpus.toml", "nodes.toml", "regions.toml", "models.toml")
)

INTRA_LINKS = ("nvlink", "pcie", "infinity-fabric")


class CatalogError(CoralError):
    """A catalog file is unreadable or holds a bad entry; the message names file, entry, field, reason."""


class _FieldError(Exception):
    """A bad value; the caller adds where it was found."""


@attrs.frozen
class _Field:
    type: Literal["str", "int", "float", "bool"]
    required: bool = True
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    unit: str = ""
    choices: tuple[str, ...] = ()


def _str(required: bool = True) -> _Field:
    return _Field("str", required=required)


def _num(
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    unit: str = "",
    required: bool = True,
) -> _Field:
    return _Field("float", required=required, gt=gt, ge=ge, le=le, unit=unit)


def _int(ge: int, le: int, unit: str = "", required: bool = True) -> _Field:
    return _Field("int", required=required, ge=ge, le=le, unit=unit)


_GPU: dict[str, _Field] = {
    "name": _str(),
    "vendor": _str(),
    "tflops_bf16": _num(gt=0, le=20_000, unit="dense BF16 TFLOPS, 10^12 FLOP/s"),
    "memory_gb": _num(gt=0, le=2000, unit="GB, 10^9 bytes"),
    "mem_bw_gbs": _num(gt=0, le=100_000, unit="GB/s, 10^9 bytes/s"),
    "source": _str(required=False),
    "mem_efficiency": _num(gt=0, le=1, unit="a fraction of peak bandwidth", required=False),
    "compute_efficiency": _num(gt=0, le=1, unit="a fraction of peak FLOP/s", required=False),
    "iter_overhead_s": _num(ge=0, le=1, unit="seconds", required=False),
}
_NODE: dict[str, _Field] = {
    "name": _str(),
    "cloud": _str(),
    "gpu": _str(),
    "gpu_count": _int(1, 64, unit="GPUs"),
    "nic_gbps": _num(gt=0, le=100_000, unit="Gbit/s, 10^9 bits/s"),
    "intra_link": _Field("str", choices=INTRA_LINKS),
    "intra_link_gbs": _num(gt=0, le=10_000, unit="GB/s per GPU per direction"),
    "disk_gbs": _num(gt=0, le=1000, unit="GB/s, 10^9 bytes/s"),
    "source": _str(required=False),
}
_REGION: dict[str, _Field] = {
    "name": _str(),
    "cloud": _str(),
    "location": _str(),
    "source": _str(required=False),
}
_OFFER: dict[str, _Field] = {
    "price": _num(gt=0, le=1000, unit="USD per node-hour"),
    "spot": _num(gt=0, le=1000, unit="USD per node-hour", required=False),
    "availability": _int(0, 1_000_000, unit="nodes"),
    "source": _str(required=False),
}
_MODEL: dict[str, _Field] = {
    "name": _str(),
    "hf_id": _str(),
    "num_layers": _int(1, 1000, unit="layers"),
    "hidden": _int(1, 1_000_000),
    "intermediate": _int(1, 10_000_000),
    "heads": _int(1, 10_000),
    "kv_heads": _int(1, 10_000),
    "head_dim": _int(1, 10_000),
    "vocab": _int(1, 10_000_000, unit="tokens"),
    "params_official_b": _num(gt=0, le=100_000, unit="billions of parameters"),
    "source": _str(required=False),
    "num_experts": _int(0, 100_000, required=False),
    "experts_active": _int(0, 100_000, required=False),
    "moe_intermediate": _int(0, 10_000_000, required=False),
    "shared_experts": _int(0, 100_000, required=False),
    "tied_embeddings": _Field("bool", required=False),
    "dtype_bytes": _num(gt=0, le=8, unit="bytes per parameter", required=False),
    "expert_bytes_per_param": _num(gt=0, le=8, unit="bytes per parameter", required=False),
    "sliding_window": _int(1, 100_000_000, unit="tokens", required=False),
    "kv_full_layers": _int(0, 1000, unit="layers", required=False),
    "max_context": _int(1, 100_000_000, unit="tokens", required=False),
}
_SPECS: dict[str, dict[str, _Field]] = {"gpu": _GPU, "node": _NODE, "region": _REGION, "model": _MODEL}
_MODES = ("override", "extend")


@attrs.define
class _OfferEntry:
    values: dict[str, Any]
    where: str
    default_source: str


@attrs.define
class _Entry:
    kind: str
    name: str
    index: int
    where: str
    mode: str  # "new", "override" or "extend"
    values: dict[str, Any]
    offers: dict[str, _OfferEntry] = attrs.field(factory=dict)


# ----------------------------------------------------------------------------------------- values


def _describe(value: object) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__} ({value!r})"


def _unit(spec: _Field) -> str:
    return f" ({spec.unit})" if spec.unit else ""


def _range_text(spec: _Field) -> str:
    parts = []
    if spec.gt is not None:
        parts.append(f"> {spec.gt:g}")
    if spec.ge is not None:
        parts.append(f">= {spec.ge:g}")
    if spec.le is not None:
        parts.append(f"<= {spec.le:g}")
    return " and ".join(parts)


def _in_range(spec: _Field, v: float) -> bool:
    return not (
        (spec.gt is not None and not v > spec.gt)
        or (spec.ge is not None and not v >= spec.ge)
        or (spec.le is not None and not v <= spec.le)
    )


def _number_from_string(spec: _Field, value: str) -> _FieldError:
    what = "an integer" if spec.type == "int" else "a number"
    try:
        float(value)
    except ValueError:
        return _FieldError(
            f"expected {what}{_unit(spec)}, got the string {value!r}; write a bare number without a unit"
        )
    return _FieldError(f"expected {what}{_unit(spec)}, got the string {value!r}; remove the quotes")


def _convert(spec: _Field, value: object) -> object:
    """Check one value against its field spec and return it in the field's Python type."""
    if spec.type == "str":
        if not isinstance(value, str):
            raise _FieldError(f"expected a string, got {_describe(value)}")
        if not value.strip():
            raise _FieldError("must not be empty")
        if spec.choices and value not in spec.choices:
            raise _FieldError(f"{value!r} is not one of {', '.join(repr(c) for c in spec.choices)}")
        return value
    if spec.type == "bool":
        if not isinstance(value, bool):
            raise _FieldError(f"expected true or false, got {_describe(value)}")
        return value
    if isinstance(value, str):
        raise _number_from_string(spec, value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        what = "an integer" if spec.type == "int" else "a number"
        raise _FieldError(f"expected {what}{_unit(spec)}, got {_describe(value)}")
    if spec.type == "int" and not isinstance(value, int):
        hint = " (write it without a decimal point)" if math.isfinite(value) and value.is_integer() else ""
        raise _FieldError(f"expected an integer{_unit(spec)}, got {value!r}{hint}")
    if not math.isfinite(value):
        raise _FieldError(f"expected a finite number{_unit(spec)}, got {value!r}")
    if not _in_range(spec, value):
        msg = f"{value!r} is out of range: must be {_range_text(spec)}{_unit(spec)}"
        if "10^9" in spec.unit and _in_range(spec, value / 1e9):
            msg += f"; it looks like plain units, write {value / 1e9:g}"
        raise _FieldError(msg)
    return float(value) if spec.type == "float" else value


def _suggest(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _known(names: Iterable[str]) -> str:
    return ", ".join(sorted(names))


# ------------------------------------------------------------------------------------------ parsing


def _read(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CatalogError(f"{path}: no such catalog file") from None
    except IsADirectoryError:
        raise CatalogError(f"{path}: is a directory, not a catalog file") from None
    except OSError as e:
        raise CatalogError(f"{path}: cannot read the catalog file: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CatalogError(f"{path}: not UTF-8 text (bad byte at offset {e.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{path}: TOML syntax error: {e}") from None


def _fields(
    spec: Mapping[str, _Field], raw: Mapping[str, Any], where: str, partial: bool, skip: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Validate the fields of one table against ``spec``; ``partial`` skips the required-field check."""
    for key in raw:
        if key not in spec and key not in skip:
            raise CatalogError(
                f"{where}: unknown field {key!r}{_suggest(key, [*spec, *skip])}; known fields: {_known(spec)}"
            )
    out: dict[str, Any] = {}
    for key, fspec in spec.items():
        if key not in raw:
            if fspec.required and not partial:
                raise CatalogError(f"{where}: missing required field {key!r}{_unit(fspec)}")
            continue
        try:
            out[key] = _convert(fspec, raw[key])
        except _FieldError as e:
            raise CatalogError(f"{where}: field {key!r}: {e}") from None
    return out


def _parse_offers(raw: object, where: str, partial: bool, default_source: str) -> dict[str, _OfferEntry]:
    if not isinstance(raw, dict):
        raise CatalogError(
            f"{where}: field 'offers': expected a table of [region.offers.\"<node type>\"] tables, got {_describe(raw)}"
        )
    offers: dict[str, _OfferEntry] = {}
    for node, body in raw.items():
        owhere = f"{where}, offer {node!r}"
        if not isinstance(body, dict):
            raise CatalogError(f"{owhere}: expected a table with price and availability, got {_describe(body)}")
        values = _fields(_OFFER, body, owhere, partial)
        if not partial:
            values.setdefault("source", default_source)
        offers[node] = _OfferEntry(values, owhere, default_source)
    return offers


def _parse_entry(path: Path, kind: str, index: int, raw: object) -> _Entry:
    where = f"{path}: {kind} entry #{index}"
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: expected a table, got {_describe(raw)}")
    if "name" not in raw:
        raise CatalogError(f"{where}: missing required field 'name'")
    try:
        name = _convert(_Field("str"), raw["name"])
    except _FieldError as e:
        raise CatalogError(f"{where}: field 'name': {e}") from None
    assert isinstance(name, str)
    if name != name.strip():
        raise CatalogError(f"{where}: field 'name': {name!r} has leading or trailing spaces")
    where = f"{path}: {kind} {name!r} (entry #{index})"

    flags: dict[str, bool] = {}
    for flag in _MODES:
        if flag in raw:
            try:
                flags[flag] = bool(_convert(_Field("bool"), raw[flag]))
            except _FieldError as e:
                raise CatalogError(f"{where}: field {flag!r}: {e}") from None
    if flags.get("override") and flags.get("extend"):
        raise CatalogError(f"{where}: field 'extend': override = true and extend = true exclude each other")
    mode = "override" if flags.get("override") else "extend" if flags.get("extend") else "new"

    skip = (*_MODES, "offers") if kind == "region" else _MODES
    values = _fields(_SPECS[kind], raw, where, partial=mode == "extend", skip=skip)
    if mode != "extend":
        values.setdefault("source", f"defined in {path}")
    entry = _Entry(kind, name, index, where, mode, values)
    if kind == "region" and "offers" in raw:
        default = values.get("source", f"defined in {path}")
        entry.offers = _parse_offers(raw["offers"], where, partial=mode == "extend", default_source=default)
    return entry


def _parse_file(path: Path) -> list[_Entry]:
    doc = _read(path)
    entries: list[_Entry] = []
    for kind, tables in doc.items():
        if kind not in _SPECS:
            raise CatalogError(
                f"{path}: unknown table {kind!r}{_suggest(kind, _SPECS)}; a catalog file holds "
                f"[[gpu]], [[node]], [[region]] and [[model]] tables"
            )
        if not isinstance(tables, list):
            raise CatalogError(
                f"{path}: {kind!r} must be an array of tables written [[{kind}]], got {_describe(tables)}"
            )
        entries.extend(_parse_entry(path, kind, i, raw) for i, raw in enumerate(tables, start=1))
    return entries


# ------------------------------------------------------------------------------------------ merging


def _extend(prev: _Entry, new: _Entry) -> _Entry:
    offers = dict(prev.offers)
    for node, offer in new.offers.items():
        old = offers.get(node)
        if old is None:
            for key in ("price", "availability"):
                if key not in offer.values:
                    raise CatalogError(
                        f"{offer.where}: missing required field {key!r} ({_OFFER[key].unit}); "
                        f"{prev.kind} {prev.name!r} has no offer for {node!r} yet"
                    )
            offer.values.setdefault("source", offer.default_source)
            offers[node] = offer
        else:
            offers[node] = _OfferEntry({**old.values, **offer.values}, offer.where, old.default_source)
    return _Entry(prev.kind, prev.name, new.index, new.where, new.mode, {**prev.values, **new.values}, offers)


def _merge(files: Sequence[Path]) -> dict[str, dict[str, _Entry]]:
    state: dict[str, dict[str, _Entry]] = {kind: {} for kind in _SPECS}
    for path in files:
        seen: dict[tuple[str, str], _Entry] = {}
        for e in _parse_file(path):
            key = (e.kind, e.name)
            if key in seen:
                raise CatalogError(
                    f"{e.where}: field 'name': duplicate name, {e.kind} {e.name!r} is already entry "
                    f"#{seen[key].index} of this file"
                )
            seen[key] = e
            table = state[e.kind]
            prev = table.get(e.name)
            if e.mode == "new":
                if prev is not None:
                    raise CatalogError(
                        f"{e.where}: field 'name': duplicate name, {e.kind} {e.name!r} is already defined "
                        f"by {prev.where}; set override = true to replace it or extend = true to change "
                        f"some of its fields"
                    )
                table[e.name] = e
            elif prev is None:
                raise CatalogError(
                    f"{e.where}: field {e.mode!r}: {e.mode} = true, but no earlier {e.kind} is named "
                    f"{e.name!r}{_suggest(e.name, table)}"
                )
            elif e.mode == "override":
                table[e.name] = e
            else:
                table[e.name] = _extend(prev, e)
    return state


# ------------------------------------------------------------------------------------------- checks


def _check_model(e: _Entry) -> None:
    v = e.values

    def bad(field: str, reason: str) -> CatalogError:
        return CatalogError(f"{e.where}: field {field!r}: {reason}")

    if v["heads"] % v["kv_heads"]:
        raise bad("kv_heads", f"kv_heads = {v['kv_heads']} does not divide heads = {v['heads']}")
    experts = v.get("num_experts", 0)
    if experts == 0:
        for field in ("experts_active", "moe_intermediate", "shared_experts", "expert_bytes_per_param"):
            if v.get(field):
                raise bad(field, f"set to {v[field]!r}, but num_experts is 0 (a dense model)")
    else:
        active = v.get("experts_active", 0)
        if active < 1:
            raise bad("experts_active", f"a MoE model (num_experts = {experts}) needs experts_active >= 1")
        if active > experts:
            raise bad("experts_active", f"experts_active = {active} exceeds num_experts = {experts}")
        if v.get("moe_intermediate", 0) < 1:
            raise bad("moe_intermediate", f"a MoE model (num_experts = {experts}) needs moe_intermediate >= 1")
    window, full = v.get("sliding_window"), v.get("kv_full_layers")
    if window is not None and full is None:
        raise bad("kv_full_layers", "required with sliding_window: how many layers keep the full context")
    if full is not None and window is None:
        raise bad("sliding_window", "required with kv_full_layers: the window of the other layers")
    if full is not None and full > v["num_layers"]:
        raise bad("kv_full_layers", f"kv_full_layers = {full} exceeds num_layers = {v['num_layers']}")


def _build(state: dict[str, dict[str, _Entry]]) -> Catalog:
    gpus = {name: GpuType(**e.values) for name, e in state["gpu"].items()}
    nodes: dict[str, NodeType] = {}
    for name, e in state["node"].items():
        gpu = e.values["gpu"]
        if gpu not in gpus:
            raise CatalogError(
                f"{e.where}: field 'gpu': unknown GPU type {gpu!r}{_suggest(gpu, gpus)}; known: {_known(gpus)}"
            )
        nodes[name] = NodeType(**e.values)
    regions: dict[str, Region] = {}
    for name, e in state["region"].items():
        offers: dict[str, Offer] = {}
        for node, o in e.offers.items():
            if node not in nodes:
                raise CatalogError(
                    f"{o.where}: unknown node type {node!r}{_suggest(node, nodes)}; known: {_known(nodes)}"
                )
            if nodes[node].cloud != e.values["cloud"]:
                raise CatalogError(
                    f"{o.where}: node type {node!r} belongs to cloud {nodes[node].cloud!r}, but region "
                    f"{name!r} is in cloud {e.values['cloud']!r}"
                )
            offers[node] = Offer(node=node, **o.values)
        regions[name] = Region(offers=offers, **e.values)
    models: dict[str, ModelArch] = {}
    for name, e in state["model"].items():
        _check_model(e)
        models[name] = ModelArch(**e.values)
    return Catalog(gpus=gpus, nodes=nodes, regions=regions, models=models)


# -------------------------------------------------------------------------------------------- API


def load_catalog(extra: Sequence[str | os.PathLike[str]] = ()) -> Catalog:
    """Load the bundled catalog, then each file of ``extra`` in order; raise `CatalogError` on any problem."""
    if isinstance(extra, str | os.PathLike):
        raise TypeError("load_catalog(extra=...) takes a sequence of paths, not a single path")
    return _build(_merge([*BUILTIN_FILES, *(Path(p) for p in extra)]))


def catalog_to_dict(cat: Catalog) -> dict[str, Any]:
    """A JSON-ready view of the catalog, keyed by name, with each model's derived sizes added."""
    models = {}
    for name, m in cat.models.items():
        models[name] = {
            **attrs.asdict(m),
            "derived": {
                "total_params": m.total_params,
                "active_params": m.active_params,
                "weight_bytes": m.weight_bytes,
                "kv_bytes_per_token": m.kv_bytes_per_token,
            },
        }
    return {
        "gpus": {name: attrs.asdict(g) for name, g in cat.gpus.items()},
        "nodes": {name: attrs.asdict(n) for name, n in cat.nodes.items()},
        "regions": {name: attrs.asdict(r) for name, r in cat.regions.items()},
        "models": models,
    }
