"""TUI cost benchmark: the CPU the terminal UI spends per bus update, replaying a journal headless.

Plays ``--journal`` (default: the tui demo journal) into the app at ``--speed`` kernel seconds per wall
second for at most ``--seconds`` wall seconds, in a headless terminal of ``--size`` (default 80x24),
with ``--view`` shown (default fleet), and reports the batches the app folded, the envelopes in them,
the process's CPU seconds and the CPU per batch. ``--profile FILE`` writes a cProfile of the run and
prints its top entries by cumulative time. Run ``python bench/tui_cost.py`` (``just bench tui-cost``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import time
from pathlib import Path

from textual.message import Message

from tui.app import CoralTui
from tui.bus import BusBatch, ReplaySource

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "fixtures" / "journals" / "tui-demo.jrnl"


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--journal", type=Path, default=DEMO, help="the journal to replay (default: the tui demo)")
    p.add_argument("--speed", type=float, default=10.0, help="kernel seconds per wall second (default: 10)")
    p.add_argument("--seconds", type=float, default=60.0, help="wall seconds to replay at most (default: 60)")
    p.add_argument("--size", default="80x24", help="terminal size COLSxROWS (default: 80x24)")
    p.add_argument("--view", default="fleet", help="the view shown: fleet, models, market, plans, events")
    p.add_argument("--profile", type=Path, default=None, help="write a cProfile of the run here")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p.parse_args()


async def replay(args: argparse.Namespace, counts: dict[str, float]) -> None:
    cols, rows = (int(x) for x in args.size.split("x"))
    app = CoralTui(ReplaySource(args.journal, speed=args.speed))
    app.animation_level = "none"
    post = app.bus.post
    envelopes = 0

    def counted(message: Message) -> object:
        nonlocal envelopes
        if isinstance(message, BusBatch):
            envelopes += len(message.envelopes)
        return post(message)

    app.bus.post = counted
    async with app.run_test(size=(cols, rows)) as pilot:
        await pilot.press(str(1 + ["fleet", "models", "market", "plans", "events"].index(args.view)))
        c0, t0 = time.process_time(), time.monotonic()
        end = t0 + args.seconds
        while time.monotonic() < end and app.state.link.state != "replay-ended":
            await asyncio.sleep(0.2)  # not pilot.pause: it posts a callback to every widget and waits for idle
        counts.update(
            cpu_s=time.process_time() - c0,
            wall_s=time.monotonic() - t0,
            batches=app.batches,
            envelopes=envelopes,
            kernel_s=app.state.now,
        )


def main() -> None:
    args = parse()
    load0 = os.getloadavg()
    counts: dict[str, float] = {}
    prof = cProfile.Profile() if args.profile is not None else None
    if prof is not None:
        prof.enable()
    asyncio.run(replay(args, counts))
    if prof is not None:
        prof.disable()
        prof.dump_stats(str(args.profile))
    out = {
        **{k: round(v, 3) for k, v in counts.items()},
        "cpu_ms_per_batch": round(1000 * counts["cpu_s"] / max(1, counts["batches"]), 2),
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(
            f"tui cost, {args.journal.name} at x{args.speed:g}, {args.size}, view {args.view}, "
            f"load {out['load_before']} -> {out['load_after']}"
        )
        print(
            f"  {out['batches']} batches ({out['envelopes']} envelopes, kernel t={out['kernel_s']:.0f} s) in "
            f"{out['wall_s']:.1f} s wall: {out['cpu_s']:.2f} s CPU, {out['cpu_ms_per_batch']} ms per batch"
        )
    if args.profile is not None:
        pstats.Stats(str(args.profile)).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
