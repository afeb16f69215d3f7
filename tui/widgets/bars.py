"""Text renderings shared by the views: GPU colours, stage bars, sparklines and number formats."""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence

from rich.text import Text

from tui.model import Sample, TemplateView

GPU_COLOURS = {
    "h200": "bright_magenta",
    "h100": "magenta",
    "a100": "blue",
    "l40s": "green",
    "l40": "bright_green",
    "l4": "yellow",
    "a10g": "cyan",
    "a10": "bright_cyan",
    "rtx6000ada": "bright_yellow",
    "mi300x": "red",
    "t4": "white",
    "v100": "bright_blue",
}
"""Named (ANSI) colours, so that GPU types stay apart on 16-colour terminals too."""
_PALETTE = ("bright_red", "bright_white", "bright_black")
SPARK = "▁▂▃▄▅▆▇█"


def gpu_family(gpu: str) -> str:
    """``l40s-48g`` -> ``l40s``; ``h100-nvl-94g`` -> ``h100``."""
    return gpu.split("-", 1)[0]


def gpu_colour(gpu: str) -> str:
    """A stable colour per GPU family."""
    fam = gpu_family(gpu)
    return GPU_COLOURS.get(fam) or _PALETTE[zlib.crc32(fam.encode()) % len(_PALETTE)]


def gpu_label(gpu: str) -> str:
    return gpu_family(gpu).upper()


def legend(gpus: Sequence[str]) -> Text:
    """``■ H100 ■ L40S ...`` for the GPU types shown."""
    out = Text()
    for g in sorted({gpu_family(g) for g in gpus if g and g != "?"}):
        if out:
            out.append("  ")
        out.append("■ ", style=gpu_colour(g))
        out.append(g.upper())
    return out


def _widths(parts: Sequence[float], width: int) -> list[int]:
    """Integer widths (each >= 1) proportional to ``parts``, summing to ``width`` when it allows."""
    n = len(parts)
    if n == 0:
        return []
    width = max(width, n)
    total = sum(parts) or float(n)
    raw = [width * (p if total else 1.0) / total for p in parts]
    out = [max(1, int(r)) for r in raw]
    order = sorted(range(n), key=lambda i: raw[i] - int(raw[i]), reverse=True)
    i = 0
    while sum(out) < width:
        out[order[i % n]] += 1
        i += 1
    while sum(out) > width:
        j = max(range(n), key=lambda k: out[k])
        out[j] -= 1
    return out


def stage_bar(tpl: TemplateView | None, node_types: Sequence[str], gpu_of: Mapping[str, str], width: int = 24) -> Text:
    """The layer ranges of an instance across its nodes, coloured by GPU type.

    Each distinct layer range gets a width proportional to its layers and shows its first layer; nodes
    that hold the same range (data parallel) split its width. Without the template the node types are
    shown in equal parts, marked ``?``.
    """
    text = Text(no_wrap=True, overflow="ellipsis")
    if tpl is None or not tpl.stages:
        nodes = list(node_types) or ["?"]
        for w, n in zip(_widths([1.0] * len(nodes), width), nodes, strict=True):
            g = gpu_of.get(n, "?")
            text.append(("?" + " " * w)[:w], style=f"black on {gpu_colour(g)}")
        return text
    groups: dict[tuple[int, int], list[str]] = {}
    for s in tpl.stages:
        groups.setdefault((s.start, s.end), []).append(s.gpu)
    keys = sorted(groups)
    for w, key in zip(_widths([float(e - s) for s, e in keys], width), keys, strict=True):
        gpus = groups[key]
        subs = _widths([1.0] * len(gpus), w) if w >= len(gpus) else [1] * w
        for j, (sw, g) in enumerate(zip(subs, gpus, strict=False)):
            label = str(key[0]) if j == 0 else ""
            if j == 0 and len(gpus) > 1 and sw >= len(label) + 3:
                label += f"×{len(gpus)}"
            cell = (label + " " * sw)[:sw]
            text.append(cell, style=f"black on {gpu_colour(g)}")
    return text


def stage_summary(tpl: TemplateView | None, node_types: Sequence[str], gpu_of: Mapping[str, str]) -> str:
    """``L40S×2 0-29 | H100 30-63`` (layers per GPU type), or the GPU types when the template is unknown."""
    if tpl is None or not tpl.stages:
        counts: dict[str, int] = {}
        for n in node_types:
            g = gpu_label(gpu_of.get(n, "?"))
            counts[g] = counts.get(g, 0) + 1
        return "+".join(f"{k}×{v}" if v > 1 else k for k, v in counts.items())
    groups: dict[tuple[int, int], list[str]] = {}
    for s in tpl.stages:
        groups.setdefault((s.start, s.end), []).append(gpu_label(s.gpu))
    parts = []
    for (start, end), gs in sorted(groups.items()):
        kinds: dict[str, int] = {}
        for g in gs:
            kinds[g] = kinds.get(g, 0) + 1
        who = "+".join(f"{k}×{v}" if v > 1 else k for k, v in kinds.items())
        parts.append(f"{who} {start}-{end - 1}")
    return " | ".join(parts)


def resample(samples: Sequence[Sample], attr: str, now: float, span: float, width: int) -> list[float | None]:
    """The value of ``attr`` in each of ``width`` equal time buckets over ``[now - span, now]``.

    A bucket takes the last sample at or before its end (the values are levels, not counts); buckets
    before the first sample are None.
    """
    if width <= 0:
        return []
    out: list[float | None] = []
    j = 0
    last: float | None = None
    start = now - span
    for b in range(width):
        end = start + span * (b + 1) / width
        while j < len(samples) and samples[j].t <= end:
            v = getattr(samples[j], attr)
            last = None if (attr == "attainment" and v < 0) else float(v)
            j += 1
        out.append(last)
    return out


def sparkline(values: Sequence[float | None], *, top: float | None = None, style: str = "") -> Text:
    """Block characters scaled to ``top`` (default: the largest value); None is a blank."""
    nums = [v for v in values if v is not None]
    hi = top if top is not None else (max(nums) if nums else 0.0)
    text = Text(no_wrap=True)
    for v in values:
        if v is None:
            text.append(" ")
        elif hi <= 0:
            text.append(SPARK[0], style=style)
        else:
            i = min(len(SPARK) - 1, max(0, round((len(SPARK) - 1) * max(0.0, v) / hi)))
            text.append(SPARK[i], style=style)
    return text


def money(x: float) -> str:
    return f"${x:,.2f}"


def pct(x: float) -> str:
    """A fraction as a percentage; ``-`` when unknown (negative)."""
    return "-" if x < 0 or math.isnan(x) else f"{100 * x:.1f}%"


def rate(x: float) -> str:
    return f"{x:.2f}" if x < 100 else f"{x:.0f}"


def clock(t: float) -> str:
    """Kernel seconds as ``[-]h:mm:ss``."""
    sign = "-" if t < 0 else ""
    s = int(abs(t))
    return f"{sign}{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


MODE_ABBREV = {"aggregated": "agg", "prefill": "pre", "decode": "dec"}
_NODE_WORDS = (
    ("Standard_", ""),
    ("_SECURE", ""),
    ("xlarge", "xl"),
    ("highgpu", "hg"),
    ("ultragpu", "ug"),
    ("megagpu", "mg"),
    ("standard", "std"),
    ("gpu_", ""),
)
_REGION_WORDS = (
    ("northeast", "ne"),
    ("southeast", "se"),
    ("central", "c"),
    ("north", "n"),
    ("south", "s"),
    ("east", "e"),
    ("west", "w"),
    ("europe", "eu"),
    ("lambda-", "lam-"),
    ("runpod-", "rp-"),
    ("azure-", "az-"),
)


def abbrev_mode(mode: str) -> str:
    """``aggregated`` -> ``agg``, ``prefill`` -> ``pre``, ``decode`` -> ``dec``."""
    return MODE_ABBREV.get(mode, mode[:3])


def abbrev_node(node: str) -> str:
    """A node type in fewer characters, each part still recognisable: ``g6e.12xlarge`` -> ``g6e.12xl``,
    ``a2-highgpu-1g`` -> ``a2-hg-1g``, ``g2-standard-4`` -> ``g2-std-4``, ``Standard_NC24ads_A100_v4`` ->
    ``NC24ads_A100_v4``."""
    for long, short in _NODE_WORDS:
        node = node.replace(long, short)
    return node


def abbrev_region(region: str) -> str:
    """``aws-us-east-1`` -> ``aws-us-e-1``, ``gcp-us-central1`` -> ``gcp-us-c1``."""
    for long, short in _REGION_WORDS:
        region = region.replace(long, short)
    return region


def abbrev_nodes(nodes: Sequence[str]) -> str:
    """A template's nodes as ``2×g6e.xl+p5.4xl`` (counts of each abbreviated type, in first-seen order)."""
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n] = counts.get(n, 0) + 1
    return "+".join(f"{c}×{abbrev_node(n)}" if c > 1 else abbrev_node(n) for n, c in counts.items())
