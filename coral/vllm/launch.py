"""A template as a vLLM launch: the servers to start, their arguments and their environment (pure).

One instance of a template is one vLLM deployment:

- its stages form one pipeline (``pipeline_parallel_size`` = number of stages) in the order the template's
  route runs through them, with ``VLLM_PP_LAYER_PARTITION`` set from the stages' layer ranges (uneven
  splits included);
- ``tensor_parallel_size`` is the stages' TP degree (the node's GPU count); vLLM needs one degree for all
  stages, so a template whose stages differ is refused (``coral.templates.vllm_compatibility``);
- stages on one host run in one server (vLLM's multiprocessing executor starts a worker per rank);
- stages on several hosts use vLLM's multi-node launch with the ``mp`` executor: every host runs
  ``api_server`` with ``--nnodes N --node-rank R --master-addr HEAD --master-port P``; rank 0 (the host of
  the first stage) serves HTTP, the others run ``--headless``. vLLM places ``TP x PP / N`` consecutive ranks
  on each host, so every host must hold the same number of stages, consecutive in the pipeline;
- a ``prefill`` or ``decode`` template is one side of a disaggregated pair: its server gets a
  ``--kv-transfer-config`` (``KvTransfer``), ``kv_producer`` for prefill and ``kv_consumer`` for decode;
- with ``LaunchOptions.api_key`` (``engine_key``: one per instance) the HTTP server refuses every request
  without ``Authorization: Bearer KEY`` (vLLM's ``--api-key``, given as ``VLLM_API_KEY`` in its environment,
  ``ServerLaunch.environment()``, so that the key is not in its command line, which every local user can
  read; ``coral.vllm.serve`` extends vLLM's check from ``/v1`` to every path). It listens on
  ``LaunchOptions.host``: the worker's private address where one is given, loopback by default.

``launch_plan`` refuses (``VllmLaunchError``) what vLLM cannot run as it is; it never substitutes another
layout.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
from collections.abc import Mapping, Sequence

import attrs

from coral.errors import CoralError
from coral.templates import Template, chain_order, vllm_compatibility

DEVICES = ("cpu", "gpu")
CONNECTORS = ("ExampleConnector", "NixlConnector")
SERVER_MODULE = "coral.vllm.serve"
"""The module the servers run: vLLM's OpenAI server, with Coral's fixes for known vLLM bugs."""


API_KEY_ENV = "VLLM_API_KEY"
"""The environment variable vLLM reads its API key from (as ``--api-key``)."""


def engine_key(secret: bytes, instance: str) -> str:
    """The API key of instance ``instance``'s vLLM server under ``secret`` (HMAC-SHA256, hex)."""
    return "coral-engine-" + hmac.new(secret, instance.encode(), hashlib.sha256).hexdigest()


class VllmLaunchError(CoralError):
    """A template (or launch option) that vLLM cannot run as it is; the message says why."""


@attrs.frozen
class KvTransfer:
    """The KV-transfer connector joining a prefill server to a decode server.

    ``ExampleConnector`` (vLLM's reference connector) writes each prompt's KV cache to files under
    ``path`` and the decode side reads them back: it works wherever both servers see the directory
    (CPU included). ``NixlConnector`` moves the KV cache between GPUs over NIXL (UCX: NVLink, RDMA);
    the prefill reply carries ``kv_transfer_params`` that the gateway passes on to the decode request;
    ``side_channel_port`` is the handshake port of each server (``VLLM_NIXL_SIDE_CHANNEL_PORT``).
    """

    connector: str = "ExampleConnector"
    path: str = ""
    side_channel_port: int = 5600

    def check(self) -> KvTransfer:
        if self.connector not in CONNECTORS:
            raise VllmLaunchError(
                f"kv transfer: connector must be one of {', '.join(CONNECTORS)}, got {self.connector!r}"
            )
        if self.connector == "ExampleConnector" and not self.path:
            raise VllmLaunchError("kv transfer: ExampleConnector needs a shared directory (path)")
        if not 0 < self.side_channel_port < 65536:
            raise VllmLaunchError(f"kv transfer: side_channel_port must be in 1..65535, got {self.side_channel_port}")
        return self

    def config(self, mode: str) -> dict[str, object]:
        """The ``--kv-transfer-config`` of a ``prefill`` or ``decode`` server."""
        if mode not in ("prefill", "decode"):
            raise VllmLaunchError(f"kv transfer: only prefill and decode templates transfer KV, got mode {mode!r}")
        if self.connector == "NixlConnector":
            return {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        role = "kv_producer" if mode == "prefill" else "kv_consumer"
        return {
            "kv_connector": self.connector,
            "kv_role": role,
            "kv_connector_extra_config": {"shared_storage_path": self.path},
        }

    def env(self) -> dict[str, str]:
        if self.connector == "NixlConnector":
            return {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_channel_port)}
        return {}


@attrs.frozen
class ServerLaunch:
    """One process to start on one host: ``argv`` (after the Python interpreter) and extra environment."""

    host: str
    node_rank: int
    stages: tuple[int, ...]
    argv: tuple[str, ...]
    env: Mapping[str, str]
    serves_http: bool
    api_key: str = attrs.field(default="", repr=False)

    def command(self, python: str = sys.executable) -> list[str]:
        return [python, *self.argv]

    def environment(self) -> dict[str, str]:
        """``env`` with the server's API key (``VLLM_API_KEY``) when it has one."""
        return {**self.env, API_KEY_ENV: self.api_key} if self.api_key else dict(self.env)


@attrs.frozen
class LaunchPlan:
    """A template as vLLM servers (see the module docstring)."""

    template_id: str
    model: str
    mode: str
    tensor_parallel: int
    pipeline_parallel: int
    layer_partition: tuple[int, ...]
    stage_order: tuple[int, ...]
    nnodes: int
    servers: tuple[ServerLaunch, ...]
    url: str

    @property
    def head(self) -> ServerLaunch:
        return self.servers[0]

    def for_stage(self, stage: int) -> ServerLaunch | None:
        """The server a stage's node starts (None: another node's server runs this stage)."""
        for s in self.servers:
            if s.stages and s.stages[0] == stage:
                return s
        return None


@attrs.frozen
class LaunchOptions:
    """What a launch needs besides the template: the weights and how to serve them."""

    model_path: str
    served_name: str
    device: str = "gpu"
    host: str = "127.0.0.1"
    port: int = 8000
    master_port: int = 29500
    dtype: str = "auto"
    enforce_eager: bool = False
    max_model_len: int | None = None
    kv_cache_bytes: int | None = None
    cpu_kv_space_gib: int = 1
    cpu_cores: int | None = None
    cache_root: str = ""
    kv_transfer: KvTransfer | None = None
    seed: int = 0
    extra_args: tuple[str, ...] = ()
    api_key: str = attrs.field(default="", repr=False)

    def check(self) -> LaunchOptions:
        if self.device not in DEVICES:
            raise VllmLaunchError(f"device: must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if not self.model_path:
            raise VllmLaunchError("model: a model directory (or Hugging Face id) is required")
        if not self.served_name:
            raise VllmLaunchError("served name: must not be empty")
        for name in ("port", "master_port"):
            v = getattr(self, name)
            if not 0 < v < 65536:
                raise VllmLaunchError(f"{name}: must be in 1..65535, got {v}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise VllmLaunchError(f"max_model_len: must be positive, got {self.max_model_len}")
        if self.kv_cache_bytes is not None and self.kv_cache_bytes < 1:
            raise VllmLaunchError(f"kv_cache_bytes: must be positive, got {self.kv_cache_bytes}")
        if self.cpu_kv_space_gib < 1:
            raise VllmLaunchError(f"cpu_kv_space_gib: must be at least 1, got {self.cpu_kv_space_gib}")
        if self.cpu_cores is not None and self.cpu_cores < 1:
            raise VllmLaunchError(f"cpu_cores: must be at least 1, got {self.cpu_cores}")
        if self.kv_transfer is not None:
            self.kv_transfer.check()
        return self


def cpu_threads_bind(ranks: int, cores: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers on ``cores`` cores: disjoint core ranges."""
    if ranks < 1 or cores < 1:
        raise VllmLaunchError(f"cpu binding: need at least one rank and one core, got {ranks} ranks, {cores} cores")
    if ranks > cores:
        raise VllmLaunchError(f"cpu binding: {ranks} CPU workers need at least {ranks} cores, this host has {cores}")
    per = cores // ranks
    parts = []
    for r in range(ranks):
        lo, hi = r * per, r * per + per - 1
        parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
    return "|".join(parts)


def launch_plan(tpl: Template, hosts: Sequence[str], opts: LaunchOptions) -> LaunchPlan:
    """The vLLM launch of one instance of ``tpl`` whose stage ``i`` runs on host ``hosts[i]``."""
    opts = opts.check()
    if len(hosts) != len(tpl.stages):
        raise VllmLaunchError(f"template {tpl.id}: {len(tpl.stages)} stages but {len(hosts)} hosts given")
    ok, reason = vllm_compatibility(tpl.stages, tpl.routes)
    if not ok:
        raise VllmLaunchError(f"template {tpl.id}: vLLM cannot run it as it is: {reason}")
    if tpl.mode in ("prefill", "decode") and opts.kv_transfer is None:
        raise VllmLaunchError(
            f"template {tpl.id}: a {tpl.mode} instance needs a KV-transfer connector (its other half is a "
            f"{'decode' if tpl.mode == 'prefill' else 'prefill'} instance)"
        )
    if tpl.mode == "aggregated" and opts.kv_transfer is not None:
        raise VllmLaunchError(f"template {tpl.id}: an aggregated instance takes no KV-transfer connector")
    order = chain_order(tpl.stages, tpl.routes)
    start = 0
    for i in order:
        s = tpl.stages[i]
        if s.start != start or s.end <= s.start:
            raise VllmLaunchError(
                f"template {tpl.id}: stage {i} holds layers [{s.start}, {s.end}) but the pipeline needs it to "
                f"start at layer {start}"
            )
        start = s.end
    if start != tpl.num_layers:
        raise VllmLaunchError(
            f"template {tpl.id}: the stages hold layers up to {start}, the model has {tpl.num_layers}"
        )
    tp = tpl.stages[order[0]].tp
    pp = len(order)
    partition = tuple(tpl.stages[i].layers for i in order)

    groups: list[tuple[str, list[int]]] = []
    for i in order:
        h = hosts[i]
        if groups and groups[-1][0] == h:
            groups[-1][1].append(i)
        elif any(g[0] == h for g in groups):
            raise VllmLaunchError(
                f"template {tpl.id}: host {h} holds stages that are not consecutive in the pipeline; "
                "vLLM places consecutive ranks on each host"
            )
        else:
            groups.append((h, [i]))
    nnodes = len(groups)
    sizes = {len(g[1]) for g in groups}
    if len(sizes) > 1:
        raise VllmLaunchError(
            f"template {tpl.id}: hosts hold different numbers of stages ({', '.join(str(len(g[1])) for g in groups)}); "
            "vLLM's multi-node launch puts the same number of ranks on every host"
        )

    env: dict[str, str] = {"VLLM_PP_LAYER_PARTITION": ",".join(str(k) for k in partition)} if pp > 1 else {}
    if opts.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(opts.cpu_kv_space_gib)
        cores = opts.cpu_cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_threads_bind(tp * pp // nnodes, cores)
        if pp > 1:
            env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    if opts.cache_root:
        env["VLLM_CACHE_ROOT"] = opts.cache_root
    if opts.kv_transfer is not None:
        env.update(opts.kv_transfer.env())

    common = ["-m", SERVER_MODULE, "--model", opts.model_path, "--served-model-name", opts.served_name]
    common += ["--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp), "--seed", str(opts.seed)]
    if tp * pp > 1:
        common += ["--distributed-executor-backend", "mp"]
    common += ["--dtype", opts.dtype]
    if opts.enforce_eager:
        common.append("--enforce-eager")
    if opts.max_model_len is not None:
        common += ["--max-model-len", str(opts.max_model_len)]
    if opts.kv_cache_bytes is not None:
        common += ["--kv-cache-memory-bytes", str(opts.kv_cache_bytes)]
    if opts.kv_transfer is not None:
        common += ["--kv-transfer-config", json.dumps(opts.kv_transfer.config(tpl.mode), sort_keys=True)]
    common += list(opts.extra_args)

    servers = []
    head_host = groups[0][0]
    for rank, (h, stages) in enumerate(groups):
        argv = list(common)
        if nnodes > 1:
            argv += ["--nnodes", str(nnodes), "--node-rank", str(rank)]
            argv += ["--master-addr", head_host, "--master-port", str(opts.master_port)]
        if rank == 0:
            argv += ["--host", opts.host, "--port", str(opts.port)]
        else:
            argv.append("--headless")
        key = opts.api_key if rank == 0 else ""
        servers.append(ServerLaunch(h, rank, tuple(stages), tuple(argv), dict(env), rank == 0, key))
    url_host = opts.host if opts.host not in ("0.0.0.0", "::") else head_host
    return LaunchPlan(
        tpl.id,
        tpl.model,
        tpl.mode,
        tp,
        pp,
        partition,
        tuple(order),
        nnodes,
        tuple(servers),
        f"http://{url_host}:{opts.port}",
    )


__all__ = [
    "API_KEY_ENV",
    "CONNECTORS",
    "DEVICES",
    "KvTransfer",
    "LaunchOptions",
    "LaunchPlan",
    "ServerLaunch",
    "VllmLaunchError",
    "cpu_threads_bind",
    "engine_key",
    "launch_plan",
]
