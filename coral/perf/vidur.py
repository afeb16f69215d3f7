"""Loader for Vidur's measured operator timings (``../shared/reference/vidur-profiling/``, see its README).

Layout: ``compute/GPU/ORG/MODEL/mlp.csv`` (per-operator times of one transformer layer on one GPU holding a
1/TP shard, by token count and TP) and ``network/SETUP/{all_reduce,send_recv}.csv`` (NCCL times by message
size and worker count). Times are in milliseconds in the files and in seconds here; the ``median`` of each
operator's repeats is used.

Everything is read and checked before anything is returned: a missing folder, a missing column, an empty
or non-numeric value or a non-positive count raises one ``ProfileError`` naming the file, the row (the
file's line number; the header is line 1) and the column, and nothing is half-loaded.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import attrs
import numpy as np
from numpy.typing import NDArray

from coral.perf.profile import ProfileError

OPS = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
OPTIONAL_OPS = ("post_attention_layernorm",)
"""Operators a model may lack (phi-2 runs attention and MLP in parallel off one norm): their times are
absent from ``OpTable.times_s`` rather than zero."""
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size")
COUNT_COLUMNS = ("num_tokens", "num_tensor_parallel_workers")
COMM_COLUMNS = ("num_workers", "size", "devices_per_node")
COMM_FILES = ("all_reduce", "send_recv")
GPU_DIRS = {"a100": "a100-80g", "h100": "h100-80g", "a40": "a40-48g"}
"""The folder names of the data and the GPU types they were measured on (a40-48g is not a catalog type:
``coral.perf.fit`` carries its datasheet figures, to scale from)."""

F = NDArray[np.float64]


@attrs.frozen(eq=False)
class OpTable:
    """One ``mlp.csv``: a model's operator times on one GPU type, one row per (tokens, TP) measurement."""

    gpu: str
    model: str
    path: Path
    n_head: int
    n_kv_head: int
    n_embd: int
    n_expanded_embd: int
    vocab_size: int
    gated: bool
    tokens: F
    tp: F
    times_s: dict[str, F]

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@attrs.frozen(eq=False)
class CommTable:
    """One network CSV: a collective's times on one setup (``*_dgx``: NVSwitch; ``*_pairwise_nvlink``)."""

    setup: str
    collective: str
    path: Path
    num_workers: F
    devices_per_node: F
    size_bytes: F
    times_s: F


@attrs.frozen
class VidurData:
    """Everything under one profiling folder."""

    root: Path
    compute: tuple[OpTable, ...]
    network: tuple[CommTable, ...]

    @property
    def gpus(self) -> tuple[str, ...]:
        """Catalog GPU names that have operator measurements."""
        return tuple(sorted({t.gpu for t in self.compute}))


def _rows(path: Path, needed: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        text = path.read_text()
    except OSError as e:
        raise ProfileError(f"{path}: cannot read: {e.strerror}") from e
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    for col in needed:
        if col not in header:
            raise ProfileError(f"{path}:1: column '{col}' missing from the header")
    rows = list(reader)
    if not rows:
        raise ProfileError(f"{path}: no data rows")
    return rows


def _num(path: Path, line: int, row: dict[str, str], col: str, *, positive: bool = False) -> float:
    raw = row.get(col)
    try:
        v = float(raw) if raw is not None else math.nan
    except ValueError:
        v = math.nan
    if not math.isfinite(v):
        raise ProfileError(f"{path}:{line}: column '{col}': not a number: {raw!r}")
    if v < 0 or (positive and v <= 0):
        raise ProfileError(f"{path}:{line}: column '{col}': must be {'positive' if positive else '>= 0'}, got {raw!r}")
    return v


def _constant(path: Path, rows: list[dict[str, str]], col: str) -> int:
    first = int(_num(path, 2, rows[0], col, positive=True))
    for line, row in enumerate(rows, start=2):
        if int(_num(path, line, row, col, positive=True)) != first:
            raise ProfileError(f"{path}:{line}: column '{col}': {row[col]!r} differs from row 2's {first}")
    return first


def load_op_table(path: Path, gpu: str, model: str) -> OpTable:
    """Read one ``mlp.csv``."""
    required = tuple(op for op in OPS if op not in OPTIONAL_OPS)
    rows = _rows(
        path, tuple(f"time_stats.{op}.median" for op in required) + SHAPE_COLUMNS + COUNT_COLUMNS + ("use_gated_mlp",)
    )
    ops = tuple(op for op in OPS if op in required or f"time_stats.{op}.median" in rows[0])
    medians = tuple(f"time_stats.{op}.median" for op in ops)
    times = {op: np.empty(len(rows)) for op in ops}
    tokens, tp = np.empty(len(rows)), np.empty(len(rows))
    for i, row in enumerate(rows):
        line = i + 2
        for op, col in zip(ops, medians, strict=True):
            times[op][i] = _num(path, line, row, col) * 1e-3
        tokens[i] = _num(path, line, row, "num_tokens", positive=True)
        tp[i] = _num(path, line, row, "num_tensor_parallel_workers", positive=True)
        if row["use_gated_mlp"] not in ("True", "False"):
            raw = row["use_gated_mlp"]
            raise ProfileError(f"{path}:{line}: column 'use_gated_mlp': must be True or False, got {raw!r}")
    shape = {c: _constant(path, rows, c) for c in SHAPE_COLUMNS}
    return OpTable(
        gpu=gpu,
        model=model,
        path=path,
        n_head=shape["n_head"],
        n_kv_head=shape["n_kv_head"],
        n_embd=shape["n_embd"],
        n_expanded_embd=shape["n_expanded_embd"],
        vocab_size=shape["vocab_size"],
        gated=rows[0]["use_gated_mlp"] == "True",
        tokens=tokens,
        tp=tp,
        times_s=times,
    )


def load_comm_table(path: Path, setup: str, collective: str) -> CommTable:
    """Read one network CSV (``all_reduce.csv`` or ``send_recv.csv``)."""
    median = f"time_stats.{collective}.median"
    rows = _rows(path, (median, *COMM_COLUMNS))
    cols = {c: np.empty(len(rows)) for c in (median, *COMM_COLUMNS)}
    for i, row in enumerate(rows):
        for c in cols:
            cols[c][i] = _num(path, i + 2, row, c, positive=c != median)
    return CommTable(
        setup, collective, path, cols["num_workers"], cols["devices_per_node"], cols["size"], cols[median] * 1e-3
    )


def load_vidur(root: Path) -> VidurData:
    """Read every table under ``root``; raise ``ProfileError`` on the first problem, returning nothing."""
    compute_dir, network_dir = root / "compute", root / "network"
    for d in (root, compute_dir, network_dir):
        if not d.is_dir():
            raise ProfileError(f"{d}: profiling folder missing")
    compute: list[OpTable] = []
    for gdir in sorted(p for p in compute_dir.iterdir() if p.is_dir()):
        if gdir.name not in GPU_DIRS:
            raise ProfileError(f"{gdir}: unknown GPU folder {gdir.name!r}; known: {', '.join(sorted(GPU_DIRS))}")
        for path in sorted(gdir.glob("*/*/mlp.csv")):
            compute.append(load_op_table(path, GPU_DIRS[gdir.name], path.parent.name))
    network: list[CommTable] = []
    for sdir in sorted(p for p in network_dir.iterdir() if p.is_dir()):
        for coll in COMM_FILES:
            path = sdir / f"{coll}.csv"
            if path.exists():
                network.append(load_comm_table(path, sdir.name, coll))
    if not compute:
        raise ProfileError(f"{compute_dir}: no compute/GPU/ORG/MODEL/mlp.csv files")
    if not network:
        raise ProfileError(f"{network_dir}: no network/SETUP/*.csv files")
    return VidurData(root, tuple(compute), tuple(network))


ENV_VAR = "CORAL_VIDUR_DIR"


def default_root() -> Path:
    """``$CORAL_VIDUR_DIR`` when set, else ``../shared/reference/vidur-profiling`` beside the repository
    (CI's checkout has it; a user's may not)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "reference" / "vidur-profiling"
