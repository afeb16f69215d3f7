"""TUI steering benchmark: each steering action driven in tmux at 80x24, timed from the key press to its effect.

Starts ``coral up --tui --speed 10`` (on a store that already holds the scenario's library) in a detached
tmux session of 80x24 on a private tmux socket, then, as a user would, per action: opens its form or
pop-up, fills it, and presses the key that sends it (Enter or ``y``), then polls the pane
(``tmux capture-pane -p``, every 50 ms) until the effect shows:

- ``pause`` / ``resume``: the header reads ``PAUSED`` / ``allocator on``;
- ``replan``, ``demand`` (chat-8b to 20 req/s), ``availability`` (aws-us-east-1 g5.xlarge to 10 nodes),
  ``price`` (the same entry to $0.5/h), ``slo`` (chat-8b: 2 s, 0.1 s, 0.9), ``forbid`` (the first template
  the form lists, after its preview), ``pin`` (chat-8b to the first template its form lists), ``unpin``
  (the pin form's Clear), ``allow`` (the forbidden one), ``drain`` (``x`` on the instance under the
  cursor) and ``churn`` (factor 0.5): the owner's answer (``accepted by ...``) in the notification; where
  the action shows elsewhere on the Fleet view, that too (availability: the node grid's cell reads
  ``/10``; drain: the instance's row reads ``draining``); where it changes the plan, the header's planned
  cost changing (the next plan, or ``-`` when it did not change within the time limit).

- ``faster`` / ``slower``: ``]`` / ``[`` (``SetSpeed`` to the mesh's driver), until the header's second
  line reads the new speed (``speed x20``, then ``speed x10``).

Before typing, it waits for what a user would see: the form or question on screen, and each field's
text on that field's line before the Tab to the next. Reported per action: seconds from the key that
sends it to the answer and to the plan change (target: within 2 s at ``--speed 10``), with the load
average; ``--transcript FILE`` keeps every pane captured at an effect. Run
``python bench/tui_steer.py --store PATH`` (``just bench tui-steer``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOCKET = f"coral-tui-steer-{os.getpid()}"
SESSION = "steer"
POLL_S = 0.05


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", type=Path, default=None, help="template store (default: the user data dir)")
    p.add_argument("--speed", default="10", help="the mesh's speed (default: 10)")
    p.add_argument("--bind", default="tcp://127.0.0.1:7941", help="kernel address (default: tcp://127.0.0.1:7941)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for an effect (default: 30)")
    p.add_argument("--transcript", type=Path, default=None, help="write the panes captured at each effect here")
    p.add_argument("--settle", type=float, default=2.0, help="seconds to wait after the UI is live (default: 2)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p.parse_args()


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, check=False).stdout


def pane() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def keys(*ks: str, literal: bool = False) -> float:
    """Send keys; return the time they were sent."""
    t = time.monotonic()
    tmux("send-keys", "-t", SESSION, *(["-l"] if literal else []), *ks)
    return t


def header(text: str) -> str:
    return text.splitlines()[0] if text else ""


def flat(text: str) -> str:
    """The pane as one line: a notification wraps over several rows, behind a bar."""
    return re.sub(r"[\s▌]+", " ", text)


def header2(text: str) -> str:
    lines = text.splitlines()
    return lines[1] if len(lines) > 1 else ""


def plan_cost(text: str) -> str | None:
    m = re.search(r"plan \$([\d.,]+)", header(text))
    return m.group(1) if m else None


def on_line(label: str, value: str) -> Callable[[str], bool]:
    """The form's field ``label`` shows ``value`` on its line (what the user sees before the next Tab)."""
    return lambda s: any(label in line and value in line.split(label, 1)[1] for line in s.splitlines())


def wait(pred: Callable[[str], bool], timeout: float) -> tuple[float | None, str]:
    """Poll the pane until ``pred`` holds; return (the time it first held, or None, and the pane)."""
    end = time.monotonic() + timeout
    text = pane()
    while not pred(text):
        if time.monotonic() > end:
            return None, text
        time.sleep(POLL_S)
        text = pane()
    return time.monotonic(), text


def main() -> None:
    args = parse()
    store = f" --store {shlex.quote(str(args.store))}" if args.store is not None else ""
    cmd = (
        f"cd {shlex.quote(str(ROOT))} && PYTHONPATH={shlex.quote(str(ROOT))} coral up --tui --no-build "
        f"--speed {shlex.quote(args.speed)} --bind {shlex.quote(args.bind)}{store}; echo EXIT $?; sleep 3600"
    )
    tmux("new-session", "-d", "-s", SESSION, "-x", "80", "-y", "24", cmd)
    load0 = os.getloadavg()
    rows: list[dict[str, object]] = []
    shots: list[str] = []
    try:
        t, text = wait(lambda s: "live" in header(s) and "Fleet" in s, 120.0)
        if t is None:
            raise SystemExit(f"tui-steer: the TUI did not come up in 120 s; last pane:\n{text}")
        shots.append(f"--- started\n{text}")
        time.sleep(args.settle)

        def quiet() -> None:  # the previous action's notifications gone, no pop-up open
            wait(lambda s: "accepted" not in s and "sent" not in flat(s).split(), 15.0)

        def measure(
            name: str,
            press: Callable[[], float],
            answer: Callable[[str], bool],
            plan: bool = False,
            effect: Callable[[str], bool] | None = None,
        ) -> None:
            quiet()
            before = plan_cost(pane())
            t0 = press()
            ta, text = wait(answer, args.timeout)
            te = tp = None
            if effect is not None:
                te, text2 = wait(effect, args.timeout)
                text = text2 if te is not None else text
            if plan:
                tp, text2 = wait(lambda s: plan_cost(s) not in (None, before), args.timeout)
                text = text2 if tp is not None else text
            rows.append(
                {
                    "action": name,
                    "answer_s": None if ta is None else round(ta - t0, 2),
                    "effect_s": None if te is None else round(te - t0, 2),
                    "plan_s": None if tp is None else round(tp - t0, 2),
                    "plan_cost": [before, plan_cost(text)],
                }
            )
            r = rows[-1]
            shots.append(f"--- {name}: answer {r['answer_s']} s, shown {r['effect_s']} s, plan {r['plan_s']} s\n{text}")

        def confirm(key: str, title: str) -> Callable[[], float]:
            def go() -> float:
                keys(key)
                wait(lambda s: "Yes (y)" in s and title in s, args.timeout)
                return keys("y")

            return go

        def form(
            key: str, title: str, *fields: tuple[str, str], pick: int = 0, preview: bool = False, send: str = "Enter"
        ) -> Callable[[], float]:
            """Open the form with ``key``, type each (label, value) and Tab on, Tab ``pick`` more times (to the
            template list), send with ``send`` (Enter, or C-u: Clear), and answer ``y`` to a preview."""

            def go() -> float:
                keys(key, literal=True)
                wait(lambda s: title in s and "Cancel (Esc)" in s, args.timeout)
                for i, (label, value) in enumerate(fields):
                    if i:
                        keys("Tab")
                    keys(value, literal=True)
                    wait(on_line(label, value), 5.0)
                wait(lambda s: pick == 0 or "templates:" in s, 5.0)
                for _ in range(pick):  # Tab to the template list: Enter chooses the highlighted (first) one
                    keys("Tab")
                if not preview:
                    return keys(send)
                keys(send)
                wait(lambda s: "Yes (y)" in s, args.timeout)
                return keys("y")

            return go

        drained: list[str] = []

        def drain() -> float:  # x on the instance under the cursor: its form comes filled in
            keys("x", literal=True)
            _, text = wait(lambda s: "Drain instance" in s and re.search(r"Instance\s+i\d+", s) is not None, 10)
            m = re.search(r"Instance\s+(i\d+)", text)
            drained.append(m.group(1) if m else "?")
            return keys("Enter")

        def row_reads(state: str) -> Callable[[str], bool]:
            return lambda s: (
                bool(drained) and any(ln.split()[:1] == [drained[-1]] and state in ln for ln in s.splitlines())
            )

        def said(words: str) -> Callable[[str], bool]:
            return lambda s: words in flat(s) and "accepted" in flat(s)

        dep, region, node = ("Deployment", "chat-8b"), ("Region", "aws-us-east-1"), ("Node type", "g5.xlarge")
        measure("pause", confirm("p", "Pause allocator?"), lambda s: "PAUSED" in header(s))
        measure("resume", confirm("p", "Resume allocator?"), lambda s: "allocator on" in header(s))
        measure("replan", confirm("r", "Re-plan now?"), said("re-plan now"))
        measure(
            "demand", form("d", "Override demand", dep, ("Demand (req/s)", "20")), said("demand chat-8b"), plan=True
        )
        measure(
            "availability",
            form("a", "Set availability", region, node, ("Nodes obtainable", "10")),
            said("availability aws-us-east-1/g5.xlarge"),
            effect=lambda s: any(ln.split()[:1] == ["g5.xl"] and "/10 " in f"{ln} " for ln in s.splitlines()),
        )
        measure(
            "price",
            form("$", "Set price", region, node, ("Price ($/node-hour)", "0.5")),
            said("price aws-us-east-1/g5.xlarge"),
        )
        slo = form(
            "o", "Change SLO", dep, ("TTFT target (s)", "2"), ("TPOT target (s)", "0.1"), ("Attainment (0-1]", "0.9")
        )
        measure("slo", slo, said("SLO chat-8b"))
        measure("forbid", form("f", "Forbid template", pick=1, preview=True), said("forbid template"))
        measure("pin", form("n", "Pin template", dep, pick=2, preview=True), said("pin"), plan=True)
        unpin = form("n", "Pin template", dep, preview=True, send="C-u")
        measure("unpin", unpin, said("pin chat-8b to nothing"), plan=True)
        measure("allow", form("l", "Allow template", pick=1, preview=True), said("allow template"))
        measure("drain", drain, said("drain"), effect=row_reads("draining"))
        measure("churn", form("c", "Set churn penalty", ("Churn-penalty factor", "0.5")), said("churn"))
        x = float(args.speed)
        measure("faster", lambda: keys("]", literal=True), lambda s: f"speed x{2 * x:g}" in header2(s))
        measure("slower", lambda: keys("[", literal=True), lambda s: f"speed x{x:g}" in header2(s))
    finally:
        tail = pane()
        tmux("send-keys", "-t", SESSION, "q")
        time.sleep(1.0)
        tmux("kill-server")
    out = {
        "speed": args.speed,
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "actions": rows,
    }
    if args.transcript is not None:
        args.transcript.write_text("\n".join([*shots, f"--- last\n{tail}"]) + "\n")
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"tui steer at 80x24, --speed {args.speed}, load {out['load_before']} -> {out['load_after']}")
    print(f"  {'action':<12} {'answer s':>9} {'shown s':>8} {'plan s':>7}  planned cost/h before -> after")
    for r in rows:
        cost = r["plan_cost"]
        assert isinstance(cost, list)
        a, e, p = ("-" if r[k] is None else f"{r[k]:.2f}" for k in ("answer_s", "effect_s", "plan_s"))
        print(f"  {r['action']:<12} {a:>9} {e:>8} {p:>7}  ${cost[0]} -> ${cost[1]}")


if __name__ == "__main__":
    main()
