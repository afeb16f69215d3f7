"""The planning tests' shared store: a small two-deployment scenario and its template library, built once.

Under pytest-xdist a session fixture is built once per worker that runs a test needing it, so every test
that uses ``small_env`` goes to one xdist group (``--dist loadgroup``): the library is built once a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral.cli import main

SMALL = """
name = "small"
regions = ["aws-us-east-1", "gcp-us-central1"]
node_types = ["g6e.xlarge", "g6.xlarge", "g5.xlarge", "a2-highgpu-1g", "g2-standard-4"]
[planner]
nmax = 2
deadline_s = 2.0
[[deployment]]
name = "chat"
model = "llama-3.1-8b"
slo = { ttft_s = 2.0, tpot_s = 0.1 }
shape = { mean_in = 1155, mean_out = 211 }
demand = 6.0
[[deployment]]
name = "code"
model = "qwen3-14b"
slo = { ttft_s = 2.0, tpot_s = 0.1 }
shape = { mean_in = 2048, mean_out = 28 }
demand = 3.0
"""


@pytest.fixture(scope="session")
def small_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(scenario file, template store) of ``SMALL``."""
    d = tmp_path_factory.mktemp("small")
    sc = d / "small.toml"
    sc.write_text(SMALL)
    store = d / "store.sqlite"
    assert main(["templates", "build", "--scenario", str(sc), "--store", str(store), "--workers", "1", "--json"]) == 0
    return sc, store


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "small_env" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("plan-small"))
