"""The decode template's KV link is priced by the pair that will run (issue 21, item 3)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from coral.perf import PerfModel
from coral.workload import Slo, WorkloadShape
from solvers.library import kv_min_nic, place_one_batch, solve_multiset
from solvers.options import build_problem, short_output_steps
from solvers.problem import PlacementProblem
from solvers.rules import evaluate_placement

CODE_SLO = Slo(ttft_s=1.0, tpot_s=0.05, attainment=0.9)
CODE_SHAPE = WorkloadShape(mean_in=2048.0, mean_out=28.0)


def _behind(problem: PlacementProblem, perf: PerfModel, sender: float) -> PlacementProblem:
    """The decode problem with the KV transfer behind a sender of NIC ``sender`` (bytes/s)."""
    n = problem.n
    ll = np.asarray(problem.link_lat).copy()
    for i, kind in enumerate(problem.kinds):
        nic = perf.catalog.nodes[kind].nic_bytes_per_s
        ll[0, n, i] = ll[0, n, i] * nic / min(nic, sender)
    return attrs.evolve(problem, link_lat=ll)


def test_code_14b_decode_is_priced_at_its_own_nic(perf: PerfModel) -> None:
    """code-14b on a 100 Gbps p5.4xlarge: the KV transfer of the mean prompt over the quantile's decode
    steps at 100 Gbps is 9.6 ms, well inside the 50 ms TPOT; at the catalog's slowest NIC (8 Gbps), the old
    rule, it was 120 ms and no decode template existed."""
    m = perf.catalog.models["qwen3-14b"]
    nic = perf.catalog.nodes["p5.4xlarge"].nic_bytes_per_s
    p = build_problem(perf, "qwen3-14b", ["p5.4xlarge"], "decode", CODE_SLO, CODE_SHAPE)
    steps = short_output_steps(CODE_SHAPE.mean_out, CODE_SLO.attainment)
    kv = CODE_SHAPE.mean_in * m.kv_bytes_per_token
    assert p.link_lat[0, 1, 0] == pytest.approx(kv / nic / steps)
    assert p.link_lat[0, 1, 0] == pytest.approx(0.0096, abs=0.0005)
    slowest = min(nt.nic_bytes_per_s for nt in perf.catalog.nodes.values())
    assert kv / slowest / steps > CODE_SLO.tpot_s
    tpl, res, _ = solve_multiset(perf, "qwen3-14b", ["p5.4xlarge"], "decode", CODE_SLO, CODE_SHAPE, key="k")
    assert tpl is not None and res.status == "optimal"
    # a p5.4xlarge prefill instance (100 Gbps) may feed it; an 8 Gbps one may not
    assert slowest < tpl.kv_min_nic <= nic


@pytest.mark.parametrize(
    ("nodes", "model", "slo", "shape"),
    [
        (["p5.4xlarge"], "qwen3-14b", CODE_SLO, CODE_SHAPE),
        (["g6e.xlarge", "g6e.xlarge"], "qwen3-14b", Slo(2.0, 0.1, 0.9), WorkloadShape(1155.0, 211.0)),
        (["g6e.12xlarge", "g6e.xlarge"], "qwen3-14b", Slo(2.0, 0.1, 0.9), WorkloadShape(1155.0, 211.0)),
    ],
)
def test_kv_min_nic_is_the_slowest_sender_the_placement_holds_for(
    perf: PerfModel, nodes: list[str], model: str, slo: Slo, shape: WorkloadShape
) -> None:
    """The template's placement meets TPOT behind a sender of exactly ``kv_min_nic`` and fails 1% below."""
    p, res = place_one_batch(build_problem(perf, model, nodes, "decode", slo, shape), time_limit=30.0)
    assert res.status == "optimal" and res.value > 0
    nic = [perf.catalog.nodes[k].nic_bytes_per_s for k in p.kinds]
    need = kv_min_nic(p, res, nic)
    tpl, _, _ = solve_multiset(perf, model, nodes, "decode", slo, shape, key="k")
    assert tpl is not None and need == pytest.approx(tpl.kv_min_nic) and need > 0
    edges = [e for e, f in res.flows.items() if f > 1e-9]
    at = evaluate_placement(_behind(p, perf, need * (1 + 1e-9)), res.option, res.start, edges)
    assert at is not None and at[0] == pytest.approx(res.value)
    assert evaluate_placement(_behind(p, perf, need * 0.99), res.option, res.start, edges) is None


def test_only_decode_templates_carry_a_sender_requirement(perf: PerfModel) -> None:
    for mode in ("aggregated", "prefill"):
        tpl, _, _ = solve_multiset(perf, "qwen3-14b", ["p5.4xlarge"], mode, CODE_SLO, CODE_SHAPE, key="k")
        assert tpl is not None and tpl.kv_min_nic == 0.0
