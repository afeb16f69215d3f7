"""Tables that fit the terminal: which columns to show at a width, and names shortened readably.

Names are shortened by words, never by cutting their ends: known words first (``xlarge`` -> ``xl``,
``aggregated`` -> ``agg``), then the longest run of letters loses letters from its end, one at a time.
Digits are never dropped while letters are left to drop, so ``chat-8b`` and ``chat-32b`` stay
distinct, and so do ``g6e.xlarge`` and ``g6e.12xlarge``. Only a name whose digits alone do not fit is
cut in the middle (``…``), keeping its end.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

WORDS: Mapping[str, str] = {
    "aggregated": "agg",
    "prefill": "pre",
    "decode": "dec",
    "xlarge": "xl",
    "large": "l",
    "standard": "std",
    "highgpu": "hg",
    "ultragpu": "ug",
    "megagpu": "mg",
    "instruct": "it",
    "serving": "srv",
    "provisioning": "prov",
    "retiring": "ret",
    "draining": "drn",
    "loading": "load",
}
"""Usual short forms of words in node types, modes, model names and states."""

_RUN = re.compile(r"[A-Za-z]+|[0-9]+|[^A-Za-z0-9]+")


def abbreviate(name: str, width: int) -> str:
    """``name`` in at most ``width`` characters (see the module docstring); unchanged when it fits."""
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    if len(name) <= width:
        return name
    runs = _RUN.findall(name)
    runs = [WORDS.get(r.lower(), r) if r.isalpha() else r for r in runs]
    while sum(map(len, runs)) > width:
        letters = [i for i, r in enumerate(runs) if r.isalpha() and len(r) > 1]
        if not letters:
            break
        longest = max(letters, key=lambda i: (len(runs[i]), -i))
        runs[longest] = runs[longest][:-1]
    short = "".join(runs)
    if len(short) <= width:
        return short
    if width == 1:
        return short[-1]
    head = (width - 1) // 3  # the end holds the sizes and numbers that tell names apart
    return short[:head] + "…" + short[len(short) - (width - 1 - head) :]


def abbreviate_all(names: Sequence[str], width: int) -> dict[str, str]:
    """Each name shortened to ``width``; names whose short forms would clash keep their full form."""
    short = {n: abbreviate(n, width) for n in dict.fromkeys(names)}
    seen: dict[str, int] = {}
    for s in short.values():
        seen[s] = seen.get(s, 0) + 1
    return {n: s if seen[s] == 1 else n for n, s in short.items()}


def fit_columns(widths: Sequence[int], priorities: Sequence[int], total: int, *, gap: int = 3) -> list[int]:
    """The indices of the columns to show within ``total`` characters, in their order: the columns of
    lowest priority (then the rightmost) are left out first. Each column takes its width plus ``gap``
    (borders and padding), and the table one more character. The first column of highest priority is
    always kept."""
    if len(widths) != len(priorities):
        raise ValueError("widths and priorities differ in length")
    keep = list(range(len(widths)))
    order = sorted(keep, key=lambda i: (priorities[i], -i))
    must = max(keep, key=lambda i: (priorities[i], -i)) if keep else None

    def need(cols: list[int]) -> int:
        return sum(widths[i] + gap for i in cols) + 1

    for i in order:
        if need(keep) <= total:
            break
        if i != must:
            keep.remove(i)
    return keep


def fit_table(
    heads: Sequence[str],
    rows: Sequence[Sequence[str]],
    priorities: Sequence[int],
    total: int,
    *,
    short_heads: Mapping[str, str] | None = None,
    wrap: Mapping[int, int] | None = None,
    gap: int = 3,
) -> tuple[list[int], list[str]]:
    """Which columns of a table of text cells to show within ``total`` characters, and their headings
    (``short_heads`` where the table does not fit with the full ones): see ``fit_columns``. ``wrap``
    maps a column that may wrap its cells onto several lines to the width it is given then."""

    def widths_of(names: Sequence[str]) -> list[int]:
        out = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(names)]
        return [min(w, max((wrap or {}).get(i, w), len(names[i]))) for i, w in enumerate(out)]

    widths = widths_of(heads)
    if sum(widths) + gap * len(widths) + 1 <= total:
        return list(range(len(heads))), list(heads)
    names = [(short_heads or {}).get(h, h) for h in heads]
    widths = widths_of(names)
    keep = fit_columns(widths, priorities, total, gap=gap)
    return keep, [names[i] for i in keep]


def gap_text(gap: float) -> str:
    """A solver's relative gap, the one way every view prints it: a percentage with two decimals."""
    return f"{gap:.2%}"
