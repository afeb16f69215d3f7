"""`coral plan` says why demand is unmet (text and --json), from the problem itself; one gap format."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.cli import conftest as cli
from tests.cli.conftest import Coral

coral = cli.coral  # the CLI tests' fixture: run `coral` in this process

SCARCE = """
[[market]]
at = 0
region = "aws-us-east-1"
node = "{node}"
availability = 1
"""


MISSING = r"no homogeneous (prefill template meets TTFT 2 s|decode template meets TPOT 0\.1 s) \(N_max = 2\)"


def plan_json(coral: Coral, sc: Path, store: Path, *extra: str) -> dict:  # type: ignore[type-arg]
    r = coral("plan", "--scenario", str(sc), "--store", str(store), "--no-build", "--json", *extra)
    assert r.rc == 0, r.err
    return json.loads(r.out)  # type: ignore[no-any-return]


def test_all_served_gives_no_reasons_and_a_percent_gap(small_env: tuple[Path, Path], coral: Coral) -> None:
    sc, store = small_env
    p = plan_json(coral, sc, store, "--deadline", "30")
    assert p["unmet_reasons"] == {}
    r = coral("plan", "--scenario", str(sc), "--store", str(store), "--no-build", "--deadline", "30")
    assert re.search(r"status \w[\w ]*, gap \d+\.\d\d%;", r.out), r.out
    assert not any(line.startswith("unmet ") for line in r.out.splitlines())


def test_a_missing_mode_is_named_with_its_target(small_env: tuple[Path, Path], coral: Coral) -> None:
    sc, store = small_env
    p = plan_json(coral, sc, store, "--policy", "pd-homo", "--deadline", "30")
    unmet = {s["deployment"] for s in p["serving"] if s["unmet_rps"] > 1e-6}
    assert set(p["unmet_reasons"]) == unmet
    for why in p["unmet_reasons"].values():
        assert why and all(re.fullmatch(MISSING, w) for w in why), why


def test_exhausted_availability_is_named(small_env: tuple[Path, Path], coral: Coral, tmp_path: Path) -> None:
    sc, store = small_env
    text = sc.read_text().replace('regions = ["aws-us-east-1", "gcp-us-central1"]', 'regions = ["aws-us-east-1"]')
    text = text.replace("demand = 6.0", "demand = 60.0")
    nodes = ["g6e.xlarge", "g6.xlarge", "g5.xlarge"]
    scarce = tmp_path / "scarce.toml"
    scarce.write_text(text + "".join(SCARCE.format(node=n) for n in nodes))
    p = plan_json(coral, scarce, store, "--deadline", "30")
    why = p["unmet_reasons"]["chat"]
    assert why and all(
        re.fullmatch(r"availability of (g6e|g6|g5)\.xlarge in aws-us-east-1 exhausted \(1 of 1 in use\)", w)
        or re.fullmatch(r"and \d+ more \(region, node type\) pairs", w)
        for w in why
    ), why
    r = coral("plan", "--scenario", str(scarce), "--store", str(store), "--no-build", "--deadline", "30")
    assert r.rc == 0 and "unmet chat: availability of " in r.out


@pytest.mark.parametrize("gap", [0.0, 0.004, 1.0])
def test_one_gap_format(gap: float) -> None:
    from coral.display import gap_text

    assert re.fullmatch(r"\d+\.\d\d%", gap_text(gap))
