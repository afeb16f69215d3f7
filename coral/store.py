"""The template store: SQLite (WAL) keyed by a content hash of everything that determines a template.

Tables:
- ``meta(key, value)``: ``app = coral-template-store`` and ``schema`` (a store of another schema is
  refused, never migrated silently);
- ``outcomes(key, ...)``: one row per solved or pruned (model, mode, SLO, shape, node multiset) under one
  catalog entry set, perf-model version and solver parameters, with outcome ``template``, ``infeasible``,
  ``dominated`` or ``split``. A rebuild with unchanged inputs finds every key here and solves nothing;
- ``templates(id, ...)``: the templates, with their JSON body.

Prices never enter a key, so a price change invalidates nothing.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
from platformdirs import user_data_dir

from coral.catalog.types import Catalog
from coral.errors import CoralError
from coral.templates import SINK, SOURCE, Route, Stage, Template, vllm_compatibility
from coral.workload import Slo, WorkloadShape

APP = "coral-template-store"
SCHEMA = 1
OUTCOMES = ("template", "infeasible", "dominated", "split")


class StoreError(CoralError):
    """The store file is corrupt, foreign or from an incompatible version."""


def default_store_path() -> Path:
    """The store in the user's data directory."""
    return Path(user_data_dir("coral", appauthor=False)) / "templates.sqlite"


def template_key(
    catalog: Catalog,
    model: str,
    nodes: Iterable[str],
    mode: str,
    slo: Slo,
    shape: WorkloadShape,
    perf_version: str,
    solver_params: Mapping[str, Any],
) -> str:
    """Content hash of every input that determines a template (prices and availability excluded)."""
    ns = sorted(nodes)
    node_entries = {n: attrs.asdict(catalog.nodes[n]) for n in sorted(set(ns))}
    gpu_entries = {g: attrs.asdict(catalog.gpus[g]) for g in sorted({catalog.nodes[n].gpu for n in ns})}
    payload = {
        "model": attrs.asdict(catalog.models[model]),
        "nodes": ns,
        "node_entries": node_entries,
        "gpu_entries": gpu_entries,
        "mode": mode,
        "slo": attrs.asdict(slo),
        "shape": attrs.asdict(shape),
        "perf": perf_version,
        "solver": dict(sorted(solver_params.items())),
    }
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def template_from_json(d: Mapping[str, Any]) -> Template:
    """Inverse of ``Template.to_json``."""

    def end(x: str | int) -> int:
        return SOURCE if x == "source" else SINK if x == "sink" else int(x)

    stages = tuple(
        Stage(
            index=i,
            node=s["node"],
            gpu=s["gpu"],
            tp=int(s["tp"]),
            start=int(s["layers"][0]),
            end=int(s["layers"][1]),
            batch=int(s["batch"]),
            memory_bytes=float(s["memory_gb"]) * 1e9,
            decode_step_s=float(s["decode_step_s"]),
            prefill_s=float(s["prefill_s"]),
        )
        for i, s in enumerate(d["stages"])
    )
    routes = tuple(Route(end(r["src"]), end(r["dst"]), float(r["flow"])) for r in d["routes"])
    if "vllm_ok" in d:
        vllm_ok, vllm_reason = bool(d["vllm_ok"]), str(d.get("vllm_reason", ""))
    else:  # a store written before the field existed: derive it
        vllm_ok, vllm_reason = vllm_compatibility(stages, routes)
    return Template(
        id=d["id"],
        model=d["model"],
        num_layers=int(d["num_layers"]),
        mode=d["mode"],
        slo=Slo(**d["slo"]),
        shape=WorkloadShape(**d["shape"]),
        nodes=tuple(d["nodes"]),
        stages=stages,
        routes=routes,
        prefill_tok_s=float(d["prefill_tok_s"]),
        decode_tok_s=float(d["decode_tok_s"]),
        ttft_s=float(d["ttft_s"]),
        tpot_s=float(d["tpot_s"]),
        perf_version=d["perf_version"],
        status=d["status"],
        gap=float(d["gap"]),
        bound=float(d["bound"]),
        method=d["method"],
        solve_s=float(d["solve_s"]),
        vllm_ok=vllm_ok,
        vllm_reason=vllm_reason,
        formulation=str(d.get("formulation", "")),
        kv_min_nic=float(d.get("kv_min_nic", 0.0)),
        kv_sender=float(d.get("kv_sender", 0.0)),
    )


@attrs.frozen
class Outcome:
    """What became of one multiset: a template, or why there is none."""

    key: str
    model: str
    mode: str
    slo_key: str
    nodes: tuple[str, ...]
    outcome: str
    template_id: str | None
    capacity: float
    detail: str = ""


class TemplateStore:
    """A SQLite template store. Use as a context manager; one writer and many readers may share the file."""

    def __init__(self, path: Path | str, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        if readonly and not self.path.exists():
            raise StoreError(f"{self.path}: no template store here; run `coral templates build` first")
        if not readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        uri = f"file:{self.path}?mode={'ro' if readonly else 'rwc'}"
        try:
            self.db = sqlite3.connect(uri, uri=True, timeout=30.0, check_same_thread=False)
            self._check()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: not a Coral template store (corrupt or foreign file: {e})") from None

    def _check(self) -> None:
        tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            if self.readonly:
                raise StoreError(f"{self.path}: empty template store; run `coral templates build` first")
            self._init()
            return
        if "meta" not in tables:
            raise StoreError(f"{self.path}: not a Coral template store (foreign SQLite database)")
        meta = dict(self.db.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("app") != APP:
            raise StoreError(f"{self.path}: not a Coral template store (meta.app is {meta.get('app')!r})")
        if meta.get("schema") != str(SCHEMA):
            raise StoreError(
                f"{self.path}: template store schema {meta.get('schema')} is not supported by this version "
                f"(schema {SCHEMA}); rebuild it with `coral templates build --store NEW_PATH`"
            )
        if not self.readonly:
            self.db.execute("PRAGMA journal_mode=WAL")

    def _init(self) -> None:
        with self.db:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self.db.executemany("INSERT INTO meta VALUES (?, ?)", [("app", APP), ("schema", str(SCHEMA))])
            self.db.execute(
                "CREATE TABLE outcomes (key TEXT PRIMARY KEY, model TEXT NOT NULL, mode TEXT NOT NULL,"
                " slo_key TEXT NOT NULL, nodes TEXT NOT NULL, num_nodes INTEGER NOT NULL, outcome TEXT NOT NULL,"
                " template_id TEXT, capacity REAL NOT NULL, detail TEXT NOT NULL)"
            )
            self.db.execute(
                "CREATE TABLE templates (id TEXT PRIMARY KEY, model TEXT NOT NULL, mode TEXT NOT NULL,"
                " slo_key TEXT NOT NULL, nodes TEXT NOT NULL, num_nodes INTEGER NOT NULL, status TEXT NOT NULL,"
                " prefill_tok_s REAL NOT NULL, decode_tok_s REAL NOT NULL, body TEXT NOT NULL)"
            )
            self.db.execute("CREATE INDEX templates_model ON templates (model, slo_key, mode)")
            self.db.execute("CREATE INDEX outcomes_model ON outcomes (model, slo_key, mode)")

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> TemplateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writes -------------------------------------------------------------------------------------
    def put(self, outcomes: Iterable[Outcome], templates: Iterable[Template] = ()) -> None:
        """Record outcomes and templates in one transaction."""
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO templates VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        t.id,
                        t.model,
                        t.mode,
                        t.slo.key,
                        ",".join(t.nodes),
                        len(t.nodes),
                        t.status,
                        t.prefill_tok_s,
                        t.decode_tok_s,
                        json.dumps(t.to_json()),
                    )
                    for t in templates
                ],
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO outcomes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        o.key,
                        o.model,
                        o.mode,
                        o.slo_key,
                        ",".join(o.nodes),
                        len(o.nodes),
                        o.outcome,
                        o.template_id,
                        o.capacity,
                        o.detail,
                    )
                    for o in outcomes
                ],
            )

    # --- reads --------------------------------------------------------------------------------------
    def outcomes(self, keys: Iterable[str]) -> dict[str, Outcome]:
        """The recorded outcomes among ``keys``."""
        out: dict[str, Outcome] = {}
        ks = list(keys)
        for i in range(0, len(ks), 500):
            chunk = ks[i : i + 500]
            q = f"SELECT * FROM outcomes WHERE key IN ({','.join('?' * len(chunk))})"
            for r in self.db.execute(q, chunk):
                out[r[0]] = Outcome(r[0], r[1], r[2], r[3], tuple(r[4].split(",")), r[6], r[7], r[8], r[9])
        return out

    def get(self, template_id: str) -> Template:
        rows = self.db.execute("SELECT body FROM templates WHERE id = ? OR id LIKE ?", (template_id, template_id + "%"))
        found = rows.fetchall()
        if not found:
            raise StoreError(f"no template with id {template_id!r} in {self.path}")
        if len(found) > 1:
            raise StoreError(f"template id prefix {template_id!r} is ambiguous in {self.path}")
        return template_from_json(json.loads(found[0][0]))

    def query(self, *, model: str | None = None, slo: Slo | None = None, mode: str | None = None) -> list[Template]:
        """Templates by model, SLO and mode (each optional), ordered by model, size and capacity."""
        where, params = [], []
        for col, val in (("model", model), ("slo_key", slo.key if slo else None), ("mode", mode)):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(val)
        q = "SELECT body FROM templates" + (" WHERE " + " AND ".join(where) if where else "")
        q += " ORDER BY model, mode, num_nodes, nodes"
        return [template_from_json(json.loads(r[0])) for r in self.db.execute(q, params)]

    def fitting(self, available: Mapping[str, int], **filters: Any) -> list[Template]:
        """Templates whose node counts fit within ``available`` (node type -> count)."""
        return [t for t in self.query(**filters) if all(available.get(n, 0) >= c for n, c in t.node_counts.items())]

    def pareto(self, model: str, prices: Mapping[str, float], **filters: Any) -> list[Template]:
        """Templates of ``model`` on the (cost per hour, capacity) frontier under ``prices``."""
        rows = []
        for t in self.query(model=model, **filters):
            if all(n in prices for n in t.nodes):
                rows.append((sum(prices[n] for n in t.nodes), -(t.prefill_tok_s + t.decode_tok_s), t))
        rows.sort(key=lambda r: (r[0], r[1]))
        front: list[Template] = []
        best = 0.0
        for _cost, negcap, t in rows:
            if -negcap > best:
                front.append(t)
                best = -negcap
        return front

    def counts(self) -> dict[str, int]:
        """Outcome counts over the whole store."""
        return dict(self.db.execute("SELECT outcome, COUNT(*) FROM outcomes GROUP BY outcome").fetchall())

    def __iter__(self) -> Iterator[Template]:
        return iter(self.query())
