"""Template library build: enumeration bounds, lossless pruning, resumable builds, CLI and bad input."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from coral.catalog import Catalog
from coral.cli import main
from coral.cli.build import UNPROVEN, BuildJob, BuildReport, Solved, _params, _record, _spanning, build_library
from coral.perf import PerfModel
from coral.store import TemplateStore
from coral.workload import Slo, WorkloadShape
from solvers.combos import best_split, enumerate_multisets, splits, sub_multisets
from solvers.fastplace import PLACER
from solvers.library import solve_multiset

NODES = ["g6e.xlarge", "g6.xlarge", "p5.4xlarge"]
JOB = BuildJob("llama-3.1-8b", "aggregated", Slo(2.0, 0.1), WorkloadShape(1155, 211))
JOB32 = BuildJob("qwen3-32b", "aggregated", Slo(2.0, 0.1), WorkloadShape(1155, 211))
"""A model that needs several of these nodes (only the H100 holds it alone), so multi-node templates stay."""


def test_enumeration_respects_memory_window(perf: PerfModel, catalog: Catalog) -> None:
    m = catalog.models["qwen3-32b"]
    levels = enumerate_multisets(perf, "qwen3-32b", NODES, JOB.shape, nmax=3, rho=4.0)
    for size, sets in levels.items():
        for s in sets:
            assert len(s) == size and list(s) == sorted(s)
            raw = sum(catalog.gpu_of(n).memory_bytes * catalog.nodes[n].gpu_count for n in s)
            assert raw <= 4.0 * m.weight_bytes
            assert sum(perf.usable_bytes(n) for n in s) >= m.weight_bytes
    assert levels[1] == [("p5.4xlarge",)]  # only the 80 GB H100 holds 65 GB of weights plus KV alone
    with pytest.raises(ValueError, match="nmax"):
        enumerate_multisets(perf, "qwen3-32b", NODES, JOB.shape, nmax=0)
    with pytest.raises(ValueError, match="rho"):
        enumerate_multisets(perf, "qwen3-32b", NODES, JOB.shape, rho=0)


def test_split_and_sub_multisets() -> None:
    s = ("a", "a", "b")
    assert sorted(sub_multisets(s)) == [("a", "a"), ("a", "b")]
    assert sorted(splits(s)) == [(("a",), ("a", "b")), (("a", "a"), ("b",))]
    assert best_split(s, {("a",): 1.0, ("a", "b"): 2.5, ("a", "a"): 1.0, ("b",): 3.0}) == 4.0


def test_build_prunes_losslessly_and_resumes(tmp_path: Path, perf: PerfModel) -> None:
    path = tmp_path / "lib.sqlite"
    with TemplateStore(path) as store:
        first = build_library(perf, store, [JOB32], NODES, nmax=3, rho=12.0)
        assert first.enumerated > 0 and first.solved > 0 and first.kept > 0
        assert first.proven == first.kept  # nothing unproven on this small library
        rows = store.db.execute("SELECT nodes, outcome, capacity FROM outcomes").fetchall()
        second = build_library(perf, store, [JOB32], NODES, nmax=3, rho=12.0)
    assert second.solved == 0 and second.reused == first.enumerated
    caps = {tuple(n.split(",")): c for n, o, c in rows}
    partition: dict[tuple[str, ...], float] = {}
    for nodes, outcome, cap in sorted(rows, key=lambda r: (r[0].count(","), r[0])):
        ms = tuple(nodes.split(","))
        split = best_split(ms, partition)
        partition[ms] = max(cap, split)
        if outcome in ("dominated", "split") and cap > 0:
            assert split >= cap  # a pruned multiset never offers more than its replacement
        if outcome == "template":
            assert cap > split
    assert any(o == "template" and len(n.split(",")) > 1 for n, o, _ in rows)
    assert caps
    with TemplateStore(path, readonly=True) as ro:
        for t in ro.query(model="qwen3-32b"):
            flow = sum(r.flow for r in t.routes if r.src == -1)
            assert t.requests_per_s(JOB32.shape.mean_in, JOB32.shape.mean_out) == pytest.approx(flow, rel=1e-9)
            assert t.prefill_tok_s > flow * JOB32.shape.mean_in and t.decode_tok_s > flow * JOB32.shape.mean_out


def test_cli_build_list_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "cli.sqlite")
    args = ["templates", "build", "--models", "llama-3.1-8b", "--modes", "aggregated,decode",
            "--nodes", ",".join(NODES), "--nmax", "2", "--workers", "1", "--store", store, "--json"]  # fmt: skip
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kept"] > 0 and report["unproven"] == 0
    assert main(["templates", "list", "--store", store, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {t["mode"] for t in listed} == {"aggregated", "decode"}
    for t in listed:
        for key in ("id", "model", "num_layers", "mode", "slo", "nodes", "stages", "routes", "prefill_tok_s",
                    "decode_tok_s", "status", "gap"):  # fmt: skip
            assert key in t
        layers = sorted(tuple(s["layers"]) for s in t["stages"])
        assert layers[0][0] == 0 and max(e for _, e in layers) == t["num_layers"]
    assert main(["templates", "show", listed[0]["id"][:8], "--store", store]) == 0
    out = capsys.readouterr().out
    assert "routes:" in out and "capacity:" in out
    assert main(["templates", "show", listed[0]["id"], "--store", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == listed[0]["id"]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--models", "gpt-9"], "unknown model 'gpt-9'"),
        (["--nodes", "warp.drive"], "unknown node type 'warp.drive'"),
        (["--nmax", "0"], "--nmax must be at least 1"),
        (["--rho", "0"], "--rho must be positive"),
        (["--modes", "turbo"], "unknown mode 'turbo'"),
        (["--workers", "0"], "--workers must be at least 1"),
    ],
)
def test_cli_build_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str) -> None:
    store = tmp_path / "bad.sqlite"
    assert main(["templates", "build", "--store", str(store), *extra]) == 2
    assert needle in capsys.readouterr().err
    assert not store.exists()


def test_cli_refuses_foreign_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "x.sqlite"
    p.write_bytes(b"not a database" * 64)
    assert main(["templates", "list", "--store", str(p)]) == 2
    assert "not a Coral template store" in capsys.readouterr().err


def test_build_four_nodes_by_shapes(tmp_path: Path, perf: PerfModel) -> None:
    """From four nodes up every multiset is settled (by bounds or the shape search), proven, and the keys carry
    the placer's version (the keys of 1-3 node multisets do not)."""
    with TemplateStore(tmp_path / "lib.sqlite") as store:
        rep = build_library(perf, store, [JOB32], NODES, nmax=4, rho=12.0)
        settled = store.db.execute("SELECT COUNT(*) FROM outcomes WHERE num_nodes = 4").fetchone()[0]
    assert rep.proven == rep.kept and not rep.gaps
    assert settled > 0  # every 4-node multiset settled (here all by bounds: see test_floor_pruning_is_lossless)
    four = rep.paths_by_size.get(4, {})
    assert set(four) <= {"reduce", "dp-proven", "shapes", "infeasible", "search-pruned"}
    params: dict[str, object] = {"time_limit": 10.0}
    assert _params(params, ("a", "b", "c")) == params
    assert _params(params, ("a", "a", "b", "c")) == {"time_limit": 10.0, "placer": PLACER}


@pytest.mark.slow
def test_store_grows_with_nmax_and_rho(tmp_path: Path, perf: PerfModel) -> None:
    """N_max and rho choose the multisets, not their outcomes: a build at a larger N_max (or rho) on the
    same store solves only what the smaller one did not enumerate, stores no multiset twice, and ends
    with exactly the outcomes of a fresh build."""
    fresh = tmp_path / "fresh.sqlite"
    grown = tmp_path / "grown.sqlite"
    with TemplateStore(fresh) as store:
        full = build_library(perf, store, [JOB32], NODES, nmax=3, rho=12.0)
        want = store.db.execute("SELECT key, nodes, outcome, capacity FROM outcomes ORDER BY key").fetchall()
        want_t = store.db.execute("SELECT id FROM templates ORDER BY id").fetchall()
    small = enumerate_multisets(perf, JOB32.model, NODES, JOB32.shape, nmax=2, rho=4.0)
    n_small = sum(len(v) for v in small.values())
    with TemplateStore(grown) as store:
        first = build_library(perf, store, [JOB32], NODES, nmax=2, rho=4.0)
        assert first.enumerated == n_small < full.enumerated
        second = build_library(perf, store, [JOB32], NODES, nmax=3, rho=12.0)
        got = store.db.execute("SELECT key, nodes, outcome, capacity FROM outcomes ORDER BY key").fetchall()
        got_t = store.db.execute("SELECT id FROM templates ORDER BY id").fetchall()
    assert second.reused == n_small and second.enumerated == full.enumerated
    assert got == want and got_t == want_t


@pytest.mark.slow
def test_floor_pruning_is_lossless(tmp_path: Path, perf: PerfModel) -> None:
    """Every multiset that the build dropped without its exact capacity (an upper bound or the placer's
    proof reached its smaller templates) really is worth no more than they give: solved here without
    a floor, its optimum is at most its best split; and every kept template has the capacity that the
    solve without a floor finds (and every multiset reported infeasible is)."""
    with TemplateStore(tmp_path / "lib.sqlite") as store:
        rep = build_library(perf, store, [JOB], NODES, nmax=4, rho=12.0)
        rows = store.db.execute("SELECT nodes, outcome, capacity FROM outcomes").fetchall()
    assert rep.dominated + rep.split > 0
    partition: dict[tuple[str, ...], float] = {}
    checked = 0
    for nodes, outcome, cap in sorted(rows, key=lambda r: (r[0].count(","), r[0])):
        ms = tuple(nodes.split(","))
        split = best_split(ms, partition)
        partition[ms] = max(cap, split)
        _, res, _ = solve_multiset(perf, JOB.model, ms, JOB.mode, JOB.slo, JOB.shape, key="k")
        assert res.status in ("optimal", "infeasible")
        if outcome == "infeasible":
            assert res.status == "infeasible"
        elif outcome in ("dominated", "split"):
            assert res.value <= split * (1 + 1e-9)
            checked += cap == 0.0
        else:
            assert res.value == pytest.approx(cap, rel=1e-9)
    assert checked > 0  # some multisets were dropped on a bound, without their capacity


def test_unproven_outcomes_turn_off_the_spanning_search() -> None:
    """An outcome that is not proven (a template with a gap, or "infeasible" because nothing was found in
    time) is marked in its detail, and a multiset above it is not searched by connected placements
    only: its floor might not cover the placements of several components."""
    report = BuildReport()

    def solved(status: str, cap: float) -> Solved:
        return Solved("k", ("a", "b"), cap, cap * 1.1, None, "milp", status, 0.05, 0.1)

    s = ("a", "b")
    assert UNPROVEN in _record(report, JOB, s, "k", 0.0, 0.0, solved("feasible", 2.0), 2).detail
    assert UNPROVEN in _record(report, JOB, s, "k", 0.0, 0.0, solved("unknown", 0.0), 2).detail
    assert UNPROVEN not in _record(report, JOB, s, "k", 0.0, 0.0, solved("optimal", 2.0), 2).detail
    assert UNPROVEN not in _record(report, JOB, s, "k", 0.0, 0.0, solved("infeasible", 0.0), 2).detail
    unsure = [Counter({"a": 1, "b": 1})]
    assert not _spanning(("a", "b", "b"), unsure)
    assert _spanning(("a", "c", "c"), unsure)
    assert _spanning(("a", "a", "b"), [])


def test_sample_top_solves_a_seeded_sample_of_the_top_level(tmp_path: Path, perf: PerfModel) -> None:
    """``sample_top`` builds the levels below N_max in full and a seeded sample of the top level, with the
    same outcomes as a full build; the report counts the whole level. A bad value changes nothing."""
    with TemplateStore(tmp_path / "full.sqlite") as store:
        build_library(perf, store, [JOB32], NODES, nmax=3, rho=12.0)
        full = dict(store.db.execute("SELECT nodes, outcome || ':' || capacity FROM outcomes").fetchall())
    level = enumerate_multisets(perf, JOB32.model, NODES, JOB32.shape, nmax=3, rho=12.0)[3]
    path = tmp_path / "sample.sqlite"
    with TemplateStore(path) as store:
        with pytest.raises(ValueError, match="sample_top"):
            build_library(perf, store, [JOB32], NODES, nmax=3, rho=12.0, sample_top=-1)
        assert store.counts() == {}
        rep = build_library(perf, store, [JOB32], NODES, nmax=3, rho=12.0, sample_top=2)
        got = dict(store.db.execute("SELECT nodes, outcome || ':' || capacity FROM outcomes").fetchall())
        again = build_library(perf, store, [JOB32], NODES, nmax=3, rho=12.0, sample_top=2)
    top = [n for n in got if n.count(",") == 2]
    assert rep.top_level == len(level) > 2 and len(top) == 2 and rep.top_reused == 0
    assert again.solved == 0 and again.top_reused == 2
    assert all(full[n] == c for n, c in got.items())
