"""``coral up``'s set-up: its durations and speed, the ``--hosts`` file, the run options and the mesh
set-up that they make, and the vLLM fleet of ``--backend vllm``."""

from __future__ import annotations

import argparse
import math
import re
import tomllib
from pathlib import Path
from typing import Any

import attrs

from coral.cli.common import catalog_files
from coral.cli.up_workers import LOCAL_PREFIX
from coral.errors import CoralError
from coral.messages.mesh import CloudSetup, Host, MeshTiming
from coral.scenario import Scenario

DEFAULT_SPEED = 60.0
_DURATION = re.compile(r"^\s*([-+]?\d+(?:\.\d*)?|[-+]?\.\d+)\s*(ms|s|m|min|h)?\s*$")
_UNIT = {None: 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str, what: str = "--for") -> float:
    """Seconds in ``90``, ``90s``, ``5m``, ``1.5h``, ``500ms``."""
    m = _DURATION.match(text)
    if m is None:
        raise CoralError(f"{what}: expected a duration like 90s, 5m or 1h, got {text!r}")
    v = float(m.group(1)) * _UNIT[m.group(2)]
    if not v > 0:
        raise CoralError(f"{what}: must be positive, got {text!r}")
    return v


def parse_speed(text: str) -> float | None:
    """Scenario seconds per wall second; None for 'max'."""
    if text.strip().lower() == "max":
        return None
    try:
        v = float(text)
    except ValueError:
        raise CoralError(f"--speed: expected a number or 'max', got {text!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise CoralError(f"--speed: must be a positive number, got {text!r}")
    return v


def load_hosts(path: Path, scenario: Scenario) -> tuple[Host, ...]:
    """The machines of a ``--hosts`` file: ``[[host]]`` tables with ``name``, ``region`` and ``node``."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise CoralError(f"--hosts: {path}: no such file") from None
    except tomllib.TOMLDecodeError as e:
        raise CoralError(f"--hosts: {path}: TOML syntax error: {e}") from None
    rows = data.get("host")
    if not isinstance(rows, list) or not rows:
        raise CoralError(f"--hosts: {path}: needs at least one [[host]] table")
    hosts = []
    for i, row in enumerate(rows):
        where = f"--hosts: {path}: [[host]] #{i + 1}"
        extra = sorted(set(row) - {"name", "region", "node"})
        if extra:
            raise CoralError(f"{where}: unknown key {extra[0]!r} (allowed: name, region, node)")
        for key in ("name", "region", "node"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise CoralError(f"{where}: key {key!r} must be a non-empty string")
        if row["region"] not in scenario.regions:
            raise CoralError(
                f"{where}: region {row['region']!r} is not among the scenario's ({', '.join(scenario.regions)})"
            )
        if row["node"] not in scenario.node_types:
            raise CoralError(f"{where}: node type {row['node']!r} is not among the scenario's node types")
        if row["name"].startswith(LOCAL_PREFIX):
            raise CoralError(f"{where}: name {row['name']!r}: names starting {LOCAL_PREFIX!r} are a local run's")
        hosts.append(Host(row["name"], row["region"], row["node"]))
    try:
        CloudSetup(kind="hosts", hosts=tuple(hosts)).check()
    except CoralError as e:
        raise CoralError(f"--hosts: {path}: {e}") from None
    return tuple(hosts)


def mesh_setup(
    args: argparse.Namespace,
    sc: Scenario,
    cat: Any,
    perf: Any,
    library: Any,
    *,
    warmup: float | None,
    drain: float | None,
    queue: float | None,
    hosts: tuple[Host, ...] | None = None,
) -> Any:
    """The ``MeshSetup`` of a run: the cloud (simulated, ``--hosts``, or ``hosts``: a local vLLM run's,
    ``coral.cli.up_workers``), the timing and the run options."""
    from actors.compose import RunOptions, make_setup

    if hosts is None and args.hosts is not None:
        hosts = load_hosts(args.hosts, sc)
    cloud = CloudSetup() if hosts is None else CloudSetup(kind="hosts", hosts=hosts)
    timing = MeshTiming()
    if warmup is not None:
        timing = attrs.evolve(timing, warmup_s=float(math.ceil(warmup)))
    if drain is not None:
        timing = attrs.evolve(timing, drain_s=drain)
    if queue is not None:
        timing = attrs.evolve(timing, queue_timeout_s=queue)
    options = RunOptions(
        seed=args.seed,
        policy=args.policy,
        deterministic=args.no_deadline,
        columns=args.columns,
        cloud=cloud,
        timing=timing,
    )
    return make_setup(sc, cat, perf, library, options, catalog_files=catalog_files(args), profile_files=args.profiles)


def vllm_fleet(args: argparse.Namespace, sc: Scenario, cat: Any, *, local: bool) -> Any:
    """The engine factory of ``--backend vllm``: vLLM servers run by each host's ``coral worker``
    (``coral.vllm.hosted``), whose API keys derive from the key directory's engine secret; without keys,
    none on ``--hosts`` machines (loopback only), and the run's random secret on a ``local`` run's workers
    (``coral.cli.up_workers``)."""
    from coral.kernel.keys import engine_secret, keys_dir
    from coral.vllm.engine import VllmBackend
    from coral.vllm.fleet import detect_device, parse_weights, resolve_weights
    from coral.vllm.hosted import HostedFleet, HostTable

    device = detect_device(args.vllm_device)
    work = (args.vllm_dir or Path.cwd() / ".coral-vllm").resolve()
    weights = resolve_weights([d.model for d in sc.deployments], cat, parse_weights(args.weights, cat), work)
    max_len = min((cat.models[d.model].max_context or 4096) for d in sc.deployments)
    backend = VllmBackend(
        models=weights,
        device=device,
        dtype=args.vllm_dtype,
        enforce_eager=device == "cpu",  # compiled CPU start-up takes minutes; eager output is the same
        max_model_len=min(max_len, 4096) if device == "cpu" else None,
        work_dir=str(work),
        seed=args.seed,
    )
    d = keys_dir(args.keys)
    if d is not None:
        backend = attrs.evolve(backend, engine_secret=engine_secret(d, create=True))
    elif not local:
        backend = attrs.evolve(backend, engine_secret=b"")
    return HostedFleet(backend, HostTable())
