"""The loader of Vidur's profiling data, the fitted parameters file, and the fit itself."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import attrs
import numpy as np
import pytest

from coral.catalog import Catalog
from coral.perf import PerfModel
from coral.perf.fit import Spec, fit_gpu, fit_link, op_rows, predict_rows
from coral.perf.ops import PURE_STREAM_OP, GpuCurve, LinkCurve
from coral.perf.params import PARAMS_FILE, ParamsError, load_params
from coral.perf.profile import ProfileError
from coral.perf.vidur import GEMM_OPS, OPS, OpTable, default_root, load_vidur

SHAPE = "n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,num_tokens,num_tensor_parallel_workers"
COMM = ",time_stats.all_reduce.median,rank,num_workers,size,collective,devices_per_node\n"


def _mlp_csv(rows: list[tuple[int, int]], bad: str = "") -> str:
    head = ",".join(f"time_stats.{op}.median" for op in OPS) + "," + SHAPE
    lines = [head]
    for tokens, tp in rows:
        times = ",".join(f"{0.01 * (i + 1) * tokens:.4f}" for i in range(len(OPS)))
        lines.append(f"{times},32,8,4096,14336,128256,True,{tokens},{tp}")
    if bad:
        lines[2] = lines[2].replace(",True,", f",True,{bad}", 1).replace(f"{bad}{rows[1][0]},", f"{bad},", 1)
    return "\n".join(lines) + "\n"


def _tree(tmp_path: Path, mlp: str | None = None) -> Path:
    root = tmp_path / "vidur"
    d = root / "compute" / "a100" / "org" / "model-x"
    d.mkdir(parents=True)
    (d / "mlp.csv").write_text(mlp if mlp is not None else _mlp_csv([(1, 1), (2, 1), (4, 2)]))
    n = root / "network" / "a100_dgx"
    n.mkdir(parents=True)
    (n / "all_reduce.csv").write_text(COMM + "0,0.05,0,2,2048,all_reduce,2\n1,0.06,0,2,4096,all_reduce,2\n")
    return root


def test_loads_a_small_tree(tmp_path: Path) -> None:
    data = load_vidur(_tree(tmp_path))
    (t,) = data.compute
    assert (t.gpu, t.model, t.n_embd, t.gated) == ("a100-80g", "model-x", 4096, True)
    assert list(t.tokens) == [1, 2, 4] and list(t.tp) == [1, 1, 2]
    assert t.times_s["emb"][2] == pytest.approx(0.04e-3)  # ms in the file, seconds here
    (c,) = data.network
    assert c.setup == "a100_dgx" and list(c.size_bytes) == [2048, 4096]
    assert data.gpus == ("a100-80g",)


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="profiling folder missing") as e:
        load_vidur(tmp_path / "nowhere")
    assert "nowhere" in str(e.value)
    root = _tree(tmp_path)
    shutil.rmtree(root / "network")
    with pytest.raises(ProfileError, match=r"network: profiling folder missing"):
        load_vidur(root)


def test_missing_column_names_file_and_column(tmp_path: Path) -> None:
    text = _mlp_csv([(1, 1), (2, 1)]).replace("time_stats.mlp_up_proj.median", "time_stats.mlp_up.median")
    root = _tree(tmp_path, text)
    with pytest.raises(ProfileError, match=r"mlp\.csv:1: column 'time_stats\.mlp_up_proj\.median' missing"):
        load_vidur(root)


def test_non_numeric_value_names_file_row_and_column(tmp_path: Path) -> None:
    lines = _mlp_csv([(1, 1), (2, 1), (4, 1)]).splitlines()
    cells = lines[2].split(",")
    cells[OPS.index("attn_pre_proj")] = "fast"
    lines[2] = ",".join(cells)
    root = _tree(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(
        ProfileError, match=r"mlp\.csv:3: column 'time_stats\.attn_pre_proj\.median': not a number: 'fast'"
    ):
        load_vidur(root)


def test_shape_must_not_change_within_a_file(tmp_path: Path) -> None:
    text = _mlp_csv([(1, 1), (2, 1)])
    lines = text.splitlines()
    lines[2] = lines[2].replace(",4096,14336,", ",5120,14336,")
    with pytest.raises(ProfileError, match=r"mlp\.csv:3: column 'n_embd'"):
        load_vidur(_tree(tmp_path, "\n".join(lines) + "\n"))


def test_comm_non_positive_size(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / "network" / "a100_dgx" / "all_reduce.csv").write_text(COMM + "0,0.05,0,2,0,all_reduce,2\n")
    with pytest.raises(ProfileError, match=r"all_reduce\.csv:2: column 'size': must be positive"):
        load_vidur(root)


def test_unknown_gpu_folder(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / "compute" / "b200").mkdir()
    with pytest.raises(ProfileError, match="unknown GPU folder 'b200'"):
        load_vidur(root)


def test_gpu_without_data_is_derived_with_a_stated_fallback(catalog: Catalog, perf: PerfModel) -> None:
    measured = perf.gpu_curve("a100-80g")
    assert not measured.derived
    l4 = perf.gpu_curve("l4-24g")
    assert l4.derived and "derived from a40-48g" in l4.source
    assert l4.mem_bw == pytest.approx(300e9) and l4.mem_eff == perf.params.gpus["a40-48g"].mem_eff
    # a GPU type the parameter file does not know: nearest bandwidth/FLOP ratio, SMs scaled by FLOP/s
    new = attrs.evolve(catalog.gpus["h100-80g"], name="x200", tflops_bf16=2000.0, mem_bw_gbs=6800.0)
    c = perf.params.gpu_curve(new)
    assert c.derived and "no class given" in c.source and "no SM count given" in c.source
    assert "from h100-80g" in c.source  # 3.4 bytes per kFLOP, as the H100's 3.39 (A40 4.65, A100 6.5)
    assert c.sm_count == round(132 * 2000.0 / 989.4)


def test_derived_streaming_rate_scales_with_sms_and_clock(perf: PerfModel) -> None:
    """A derived GPU's streaming kernels move the class's bytes/s times the SMs x clock ratio, capped at its
    own bandwidth at the class's pure-streaming efficiency; their row latency scales with the clock."""
    base, l4, l40s = perf.params.gpus["a40-48g"], perf.gpu_curve("l4-24g"), perf.gpu_curve("l40s-48g")
    cap = base.stream[PURE_STREAM_OP][0]
    for c in (l4, l40s):
        speed = c.sm_count * c.clock_mhz / (base.sm_count * base.clock_mhz)
        for op, (e, _, a, _, _, _) in base.stream.items():
            rate = min(c.mem_bw * cap, base.mem_bw * e * speed)
            assert c.stream[op][0] * c.mem_bw == pytest.approx(rate)
            assert c.stream[op][2] == pytest.approx(a * base.clock_mhz / c.clock_mhz)
    assert l4.stream["input_layernorm"][0] * l4.mem_bw < base.stream["input_layernorm"][0] * base.mem_bw
    assert l40s.stream[PURE_STREAM_OP][0] == pytest.approx(cap)  # 2.4x the A40's SMs x clock: bandwidth-bound
    assert "no clock given" in perf.params.gpu_curve(attrs.evolve(perf.catalog.gpus["l4-24g"], name="l5")).source


def test_link_curves_measured_and_derived(perf: PerfModel) -> None:
    assert perf.link_curve("p5.48xlarge").name == "nvswitch-h100" and not perf.link_curve("p5.48xlarge").derived
    assert perf.link_curve("p4de.24xlarge").name == "nvswitch-a100"
    small = perf.link_curve("p5.4xlarge")
    assert small.name == "pcie-gen5"
    x = np.array([1e3, 1e8])
    assert np.all(perf.link_curve("p5.48xlarge").allreduce_s(x, 8) < small.allreduce_s(x, 8))


_NORM = re.compile(r"(stream\.input_layernorm = \{[^}]*?)rows_per_sm = \d+, ")
BAD_PARAMS = [
    (lambda t: t.replace("mem_eff = ", "mem_eff = -", 1), r"\[gpu\.a100-80g\]: key 'mem_eff': must be a number >= 0"),
    (lambda t: t.replace('[link."pcie-gen4"]', '[link."pcie-x"]'), r"table \[link\.pcie-gen4\] missing"),
    (
        lambda t: _NORM.sub(r"\1", t, count=1),
        r"\[gpu\.a100-80g\.stream\.input_layernorm\]: key 'rows_per_sm' missing",
    ),
    (lambda t: _NORM.sub(r"\1rows_per_sm = 0, ", t, count=1), r"\]: blend, rows_per_sm and l2_gain must be >= 1"),
    (lambda t: t.replace("l2_mb = 40\n", "", 1), r"\[gpu\.a100-80g\]: key 'l2_mb' missing"),
    (lambda t: t.replace("[l2_mb]", "[l2_cache]"), r"table \[l2_mb\] missing"),
    (lambda t: t.replace("clock_mhz = 1410\n", "", 1), r"\[gpu\.a100-80g\]: key 'clock_mhz' missing"),
    (lambda t: t.replace("[clock_mhz]", "[clocks]"), r"table \[clock_mhz\] missing"),
    (
        lambda t: t.replace('"l4-24g" = 2040', '"l4-24g" = "fast"'),
        r"\[clock_mhz\]: key 'l4-24g': must be a number >= 0, got 'fast'",
    ),
    (lambda t: t.replace('"t4-16g" = "a40-48g"', '"t4-16g" = "nope"'), r"\[class\]: key 't4-16g': 'nope' has no"),
]


@pytest.mark.parametrize(("edit", "needle"), BAD_PARAMS)
def test_params_file_bad_values(tmp_path: Path, edit: Callable[[str], str], needle: str) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text(edit(PARAMS_FILE.read_text()))
    with pytest.raises(ParamsError, match=needle):
        load_params(bad)


def test_fit_recovers_a_known_curve() -> None:
    """Rows generated from a known curve: the fit finds a curve that reproduces them on unseen shapes."""
    spec = Spec(312e12, 2039e9, 108, 40e6)
    stream = {op: (0.5, 3e-6, 4e-10, 4.0, 2, 1.3) for op in ("emb", "input_layernorm", "attn_rope", "mlp_act", "add")}
    truth = GpuCurve("t", spec.peak_flops, spec.mem_bw, spec.sm_count, 0.85, 0.7, 4e-6, 2.5, 1.05, stream, "", 40e6)
    rng = np.random.default_rng(0)
    tables = []
    for name, (h, f, nh) in {"a": (4096, 11008, 32), "b": (8192, 28672, 64), "c": (5120, 13824, 40)}.items():
        tokens = np.unique(rng.integers(1, 8192, 120)).astype(float)
        tp = np.ones_like(tokens)

        times = {op: np.zeros(len(tokens)) for op in (*stream, *GEMM_OPS)}
        t = OpTable("t", name, Path(name), nh, nh // 4, h, f, 32000, True, tokens, tp, times)
        rows = op_rows([t])
        pred = predict_rows(truth, rows)
        for op in times:
            times[op][:] = pred[rows.op == op]
        tables.append(attrs.evolve(t, times_s=times))
    rows = op_rows(tables)
    fit = rows.model != "c"
    c = fit_gpu("t", spec, rows, fit, "")
    err = np.abs(predict_rows(c, rows)[~fit] / rows.measured_s[~fit] - 1)
    assert np.median(err) < 0.01 and err.max() < 0.05


def test_link_fit_recovers_a_known_curve() -> None:
    truth = LinkCurve("x", 3e-5, 1e-6, 2e11, "")
    n = np.repeat([2.0, 4.0, 8.0], 20)
    size = np.tile(np.logspace(3, 8, 20), 3)
    t = np.array([float(truth.allreduce_s(b, int(w))) for w, b in zip(n, size, strict=True)])
    c = fit_link("x", n, size, t, "")
    assert c.latency_s == pytest.approx(3e-5, rel=0.05) and c.bw == pytest.approx(2e11, rel=0.02)


def test_real_data_loads_whole() -> None:
    root = default_root()
    if not root.is_dir():
        pytest.skip(f"{root} is absent (the shared reference folder is not next to this checkout; CORAL_VIDUR_DIR)")
    data = load_vidur(root)
    assert set(data.gpus) == {"a100-80g", "h100-80g", "a40-48g"}
    assert len({t.model for t in data.compute}) == 8
    phi = next(t for t in data.compute if t.model == "phi-2")
    assert "post_attention_layernorm" not in phi.times_s and not phi.gated
