"""Measure vLLM's real scheduler on a pipeline (``just bench pipeline``): what a served request sees and what
the engine holds, for one running server of a chain template.

Pure parts: checking a layer split against the model and the machine (``check_split``), reading vLLM's
Prometheus figures (``cache_config``, ``histogram``, ``gauge``), the KV bytes of a stage
(``kv_bytes_per_block``), matching a profile table or a saved measurement to the model (``model_info``,
``check_profile``, ``check_results``). Measuring parts (against a server's HTTP endpoint): the time of every
streamed token of a request (``stream_timed``), closed-loop runs at a fixed concurrency (``run_closed``),
open-loop Poisson arrivals (``run_open``), single prompts of growing length (``run_ttft``) and the stall that
one long prompt causes the decode streams already running (``run_stall``). While a run lasts, a
``Scraper`` counts the engine's steps and their tokens from ``/metrics`` at its start and end
(``vllm:iteration_tokens_total``): the mean decode micro-batch a step carried is (scheduled tokens - prompt
tokens) / steps. What the engine held during the run (KV-cache use, requests running) comes from vLLM's
own log lines, which the server writes from its own loop whatever the load (``SERVER_ARGS``, ``SERVER_ENV``:
one line per engine step with its requests and KV use, and every 0.25 s the running count):
``engine_log_stats`` reads the lines the run added to the server's log. Polls of ``/metrics`` are kept
beside them, but the API server answers them only between steps: on a loaded 2-core machine a 10 s PP=2
run got 3 polls, all outside the busy phase.

Workload of the closed and open runs: prompts exponential with mean ``mean_in`` (at least 4 tokens), outputs
geometric with mean ``mean_out`` (at least 2 tokens), as ``solvers.options`` assumes; seeded per run.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import numpy as np

from coral.errors import CoralError
from coral.perf.profile import ProfileTable
from coral.vllm import client
from coral.vllm.engine import prompt_ids
from coral.vllm.launch import VllmLaunchError, cpu_threads_bind


class PipelineMeasureError(CoralError):
    """A pipeline measurement cannot run or be read (bad split, mismatched file, failed request)."""


TPOT_BUCKETS = tuple(round(1e-3 * 1.04**k, 7) for k in range(213))
"""Bucket bounds (1 ms to 4 s, 4% apart) of vLLM's per-request TPOT histogram, so that its quantiles
(``histogram_quantile``) resolve 2% (vLLM's default buckets are 25-50% apart)."""
SERVER_ARGS = (
    "--enable-logging-iteration-details",
    "--custom-histogram-buckets",
    json.dumps({"inter_token_latency": list(TPOT_BUCKETS)}),
)
"""vLLM server flags the measurement reads: a log line per engine step (its requests and KV use,
``engine_log_stats``) and fine buckets for the per-request TPOT (``histogram_quantile``)."""
SERVER_ENV = {"VLLM_LOG_STATS_INTERVAL": "0.25", "PYTHONUNBUFFERED": "1"}
"""The server's environment for ``engine_log_stats``: the running count every 0.25 s, lines unbuffered."""

_ITERATION = re.compile(
    r"Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, (\d+) generation requests, "
    r"(\d+) generation tokens, iteration elapsed time: ([\d.]+) ms.*?KV cache usage: ([\d.]+)%"
)
_PERIODIC = re.compile(r"Running: (\d+) reqs, Waiting: (\d+) reqs.*?KV cache usage: ([\d.]+)%")


# -- pure: input checks --------------------------------------------------------------------------------


def parse_split(text: str) -> tuple[int, ...]:
    """``"1,3"`` -> (1, 3)."""
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise PipelineMeasureError(f"--splits: {text!r} is not a comma-separated list of layer counts") from None
    return out


def check_split(split: Sequence[int], layers: int, cores: int) -> tuple[int, ...]:
    """The split as vLLM will run it (``VLLM_PP_LAYER_PARTITION``), or an error naming why it cannot be
    launched: no stage, a stage of no layers, more stages than layers, a sum other than the model's layer
    count, or more stage workers than cores (each CPU worker is bound to cores of its own)."""
    s = tuple(int(k) for k in split)
    name = ",".join(str(k) for k in s) or "(empty)"
    if not s:
        raise PipelineMeasureError("--splits: a split needs at least one stage")
    if len(s) > layers:
        raise PipelineMeasureError(
            f"--splits {name}: PP={len(s)} exceeds the model's {layers} layers; vLLM needs a layer per stage"
        )
    bad = [i for i, k in enumerate(s) if k < 1]
    if bad:
        raise PipelineMeasureError(f"--splits {name}: stage {bad[0]} holds {s[bad[0]]} layers; every stage needs one")
    if sum(s) != layers:
        raise PipelineMeasureError(f"--splits {name}: the stages hold {sum(s)} layers, the model has {layers}")
    try:
        cpu_threads_bind(len(s), cores)
    except VllmLaunchError as e:
        raise PipelineMeasureError(f"--splits {name}: PP={len(s)} refused on this machine: {e}") from None
    return s


@attrs.frozen
class ModelInfo:
    """What the measurement needs of a model directory: layers, KV geometry, dtype bytes, a digest."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    digest: str


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def model_info(model_dir: Path, dtype: str = "float32") -> ModelInfo:
    """Read ``config.json`` of a model directory (the digest is its SHA-256)."""
    path = Path(model_dir) / "config.json"
    try:
        raw = path.read_bytes()
        cfg = json.loads(raw)
    except OSError as e:
        raise PipelineMeasureError(f"--model: {path}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise PipelineMeasureError(f"--model: {path}: not JSON ({e})") from None
    try:
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        return ModelInfo(
            int(cfg["num_hidden_layers"]),
            int(cfg.get("num_key_value_heads", heads)),
            head_dim,
            _DTYPE_BYTES[dtype],
            hashlib.sha256(raw).hexdigest()[:16],
        )
    except (KeyError, TypeError, ValueError):
        raise PipelineMeasureError(f"--model: {path} lacks the layer, head or size fields of a decoder") from None


def check_profile(table: ProfileTable, source: str, model: str, gpu: str) -> ProfileTable:
    """The profile table if it is the measured model's on the measured GPU type, else a one-line error."""
    if table.model != model:
        raise PipelineMeasureError(
            f"--profile {source}: its table is of model {table.model!r}, the bench runs {model!r}"
        )
    if table.gpu != gpu:
        raise PipelineMeasureError(
            f"--profile {source}: its table is of GPU type {table.gpu!r}, the bench runs {gpu!r}"
        )
    return table


def check_results(doc: Mapping[str, Any], source: str, info: ModelInfo) -> Mapping[str, Any]:
    """A saved measurement if it was taken on this model (same config digest and layer count)."""
    m = doc.get("model") if isinstance(doc, Mapping) else None
    if not isinstance(m, Mapping) or "digest" not in m or "layers" not in m:
        raise PipelineMeasureError(f"--results {source}: no 'model' record with a digest and a layer count")
    if m["digest"] != info.digest or int(m["layers"]) != info.layers:
        raise PipelineMeasureError(
            f"--results {source}: measured on model {m['digest']} ({m['layers']} layers), "
            f"not on this one ({info.digest}, {info.layers} layers)"
        )
    return doc


# -- pure: vLLM's Prometheus figures -------------------------------------------------------------------


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text -> (name, labels, value) per sample line."""
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels: dict[str, str] = {}
        for part in rest.rstrip("}").split('",'):
            if "=" in part:
                k, _, v = part.partition("=")
                labels[k.strip()] = v.strip().strip('"')
        try:
            out.append((name, labels, float(value)))
        except ValueError:
            continue
    return out


def cache_config(text: str) -> tuple[int, int]:
    """(block size in tokens, KV blocks allocated) from ``vllm:cache_config_info``."""
    for name, labels, _ in samples(text):
        if name == "vllm:cache_config_info":
            try:
                return int(labels["block_size"]), int(labels["num_gpu_blocks"])
            except (KeyError, ValueError):
                break
    raise PipelineMeasureError("/metrics: no vllm:cache_config_info with block_size and num_gpu_blocks")


def gauge(text: str, name: str) -> float:
    """A metric's value summed over its label sets (0 when absent)."""
    return sum(v for n, _, v in samples(text) if n == name)


def histogram(text: str, name: str) -> tuple[float, float]:
    """(sum, count) of a histogram."""
    return gauge(text, name + "_sum"), gauge(text, name + "_count")


def engine_log_stats(text: str) -> dict[str, float]:
    """What vLLM's own log lines (``SERVER_ARGS``, ``SERVER_ENV``) say the engine did and held.

    Per engine step (``Iteration(i)`` lines): the steps, the mean decode sequences per step and the peak KV
    use; every 0.25 s (``Running:`` lines, written only while the engine is busy): the peak and mean
    requests running and the peak KV use. KV use is the fraction of the block pool in use."""
    steps = [tuple(float(x) for x in m.groups()) for m in _ITERATION.finditer(text)]
    ticks = [tuple(float(x) for x in m.groups()) for m in _PERIODIC.finditer(text)]
    kv = [s[6] / 100.0 for s in steps] + [t[2] / 100.0 for t in ticks]
    running = [t[0] for t in ticks]
    return {
        "log_steps": float(len(steps)),
        "log_micro_batch": float(np.mean([s[3] for s in steps])) if steps else math.nan,
        "log_step_ms": float(np.median([s[5] for s in steps])) if steps else math.nan,
        "log_ticks": float(len(ticks)),
        "log_peak_running": max(running, default=0.0),
        "log_mean_running": float(np.mean(running)) if running else math.nan,
        "log_peak_kv_frac": max(kv, default=0.0),
    }


def histogram_quantile(first: str, last: str, name: str, q: float) -> tuple[float, float, float]:
    """(q-quantile, mean, count) of the observations a histogram gained between two ``/metrics`` texts:
    the quantile interpolated linearly inside its bucket (NaN for none, or beyond the last finite bound)."""

    def cumulative(text: str) -> dict[float, float]:
        out: dict[float, float] = {}
        for n, labels, v in samples(text):
            if n == name + "_bucket" and "le" in labels:
                le = float(labels["le"])
                out[le] = out.get(le, 0.0) + v
        return out

    a, z = cumulative(first), cumulative(last)
    bounds = sorted(z)
    cum = [z[b] - a.get(b, 0.0) for b in bounds]
    s0, c0 = histogram(first, name)
    s1, c1 = histogram(last, name)
    count = c1 - c0
    mean = (s1 - s0) / count if count > 0 else math.nan
    if count <= 0 or not bounds:
        return math.nan, mean, count
    want = q * count
    lo_b, lo_c = 0.0, 0.0
    for b, c in zip(bounds, cum, strict=True):
        if c >= want:
            if not math.isfinite(b):
                return math.nan, mean, count
            return lo_b + (b - lo_b) * ((want - lo_c) / (c - lo_c) if c > lo_c else 1.0), mean, count
        lo_b, lo_c = b, c
    return math.nan, mean, count


def kv_bytes_per_block(info: ModelInfo, block_size: int, layers: int) -> int:
    """Bytes one KV block takes on a stage of ``layers`` layers (keys and values of every layer)."""
    return 2 * block_size * info.kv_heads * info.head_dim * info.dtype_bytes * layers


def percentile(xs: Sequence[float], q: float) -> float:
    """The q-quantile (0..1, linear interpolation); NaN for no data."""
    return float(np.quantile(np.asarray(xs, dtype=np.float64), q)) if len(xs) else math.nan


def workload(seed: int, n: int, mean_in: float, mean_out: float, max_len: int) -> list[tuple[int, int]]:
    """``n`` (prompt, output) token counts: exponential prompts, geometric outputs, within ``max_len``."""
    rng = np.random.default_rng(seed)
    ins = np.clip(np.round(rng.exponential(mean_in, n)), 4, max_len // 2).astype(int)
    outs = np.clip(rng.geometric(1.0 / mean_out, n), 2, max_len // 4).astype(int)
    return [(int(a), int(b)) for a, b in zip(ins, outs, strict=True)]


# -- measuring ------------------------------------------------------------------------------------------


@attrs.frozen
class Timed:
    """One streamed request: prompt and output sizes, wall times of its start and of every token."""

    prompt: int
    out: int
    started: float
    tokens: tuple[float, ...]

    @property
    def ttft(self) -> float:
        return self.tokens[0] - self.started

    @property
    def tpot(self) -> float:
        """Mean seconds per output token after the first (NaN for a single token)."""
        n = len(self.tokens)
        return (self.tokens[-1] - self.tokens[0]) / (n - 1) if n > 1 else math.nan


def stream_timed(base: str, served: str, prompt: Sequence[int], max_tokens: int, *, api_key: str = "") -> Timed:
    """A streamed greedy completion with the arrival time of every token."""
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=600.0)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    started = time.monotonic()
    times: list[float] = []
    try:
        conn.request(
            "POST",
            "/v1/completions",
            json.dumps(client.completion_body(served, prompt, max_tokens, stream=True)),
            headers,
        )
        r = conn.getresponse()
        if not 200 <= r.status < 300:
            raise PipelineMeasureError(f"completion: HTTP {r.status}: {r.read()[:200].decode(errors='replace')}")
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            chunk = json.loads(line[5:])
            now = time.monotonic()
            for ch in chunk.get("choices", ()):
                times.extend([now] * len(ch.get("token_ids") or ()))
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise PipelineMeasureError(f"completion: {type(e).__name__}: {e}") from None
    finally:
        conn.close()
    if len(times) != max_tokens:
        raise PipelineMeasureError(f"completion: asked for {max_tokens} tokens, got {len(times)}")
    return Timed(len(prompt), max_tokens, started, tuple(times))


class Scraper:
    """While a run lasts: the step and token counters of ``/metrics`` at its start and end, the lines the
    run added to the server's log (``log``: its path, "" for none; see ``engine_log_stats``), and polls of
    ``/metrics`` in a thread for the peak KV-cache use and running count."""

    def __init__(self, base: str, api_key: str = "", every_s: float = 0.1, log: str = "") -> None:
        self.base, self.api_key, self.every_s, self.log = base, api_key, every_s, log
        self.peak_kv = 0.0
        self.peak_running = 0.0
        self.polls = 0
        self.first = ""
        self.last = ""
        self.log_text = ""
        self._log_at = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pipeline-scraper", daemon=True)

    def text(self) -> str:
        status, body = client.get(self.base, "/metrics", timeout=10.0, api_key=self.api_key)
        if status != 200:
            raise PipelineMeasureError(f"/metrics: HTTP {status}")
        return body.decode(errors="replace")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                t = self.text()
            except (PipelineMeasureError, client.HttpError):
                t = ""
            if t:
                self.polls += 1
                self.peak_kv = max(self.peak_kv, gauge(t, "vllm:kv_cache_usage_perc"))
                self.peak_running = max(self.peak_running, gauge(t, "vllm:num_requests_running"))
            self._stop.wait(self.every_s)

    def _log_size(self) -> int:
        try:
            return Path(self.log).stat().st_size if self.log else 0
        except OSError as e:
            raise PipelineMeasureError(f"server log {self.log}: {e}") from None

    def __enter__(self) -> Scraper:
        self._log_at = self._log_size()
        self.first = self.text()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.last = self.text()  # answered after the run's last step: its log lines are written by now
        if self.log:
            with Path(self.log).open("rb") as f:
                f.seek(self._log_at)
                self.log_text = f.read().decode(errors="replace")

    def steps(self) -> dict[str, float]:
        """Engine steps, their scheduled tokens and the prompt tokens over the run; the mean decode
        micro-batch (decode sequences per step), the peak KV use (fraction of the blocks) and running
        count, and the requests' TPOT as the engine timed their tokens (``engine_tpot_*``: vLLM's
        per-request histogram, from the engine core's timestamps, so free of the HTTP stream's batching)."""
        s0, c0 = histogram(self.first, "vllm:iteration_tokens_total")
        s1, c1 = histogram(self.last, "vllm:iteration_tokens_total")
        p = gauge(self.last, "vllm:prompt_tokens_total") - gauge(self.first, "vllm:prompt_tokens_total")
        steps = c1 - c0
        logged = engine_log_stats(self.log_text)
        tpot = "vllm:request_time_per_output_token_seconds"
        p50, mean, count = histogram_quantile(self.first, self.last, tpot, 0.5)
        p90 = histogram_quantile(self.first, self.last, tpot, 0.9)[0]
        return {
            "engine_tpot_mean": mean,
            "engine_tpot_p50": p50,
            "engine_tpot_p90": p90,
            "engine_tpot_n": count,
            "steps": steps,
            "tokens": s1 - s0,
            "prompt_tokens": p,
            "micro_batch": (s1 - s0 - p) / steps if steps > 0 else math.nan,
            "peak_kv_frac": max(self.peak_kv, logged["log_peak_kv_frac"]),
            "peak_running": max(self.peak_running, logged["log_peak_running"]),
            "polls": float(self.polls),
            "poll_peak_kv_frac": self.peak_kv,
            "poll_peak_running": self.peak_running,
            **logged,
        }


def kv_tokens_peak(reqs: Sequence[Timed], block_size: int) -> float:
    """The most KV tokens, in whole blocks of ``block_size``, that the requests held at once, from their
    streams: a request holds its prompt from its start, one more token at each token's arrival, and its
    blocks until its last token."""
    events: list[tuple[float, int, int]] = []  # (time, order, blocks added): a release after growth at a tie
    for r in reqs:
        held = math.ceil(r.prompt / block_size)
        events.append((r.started, 0, held))
        for k, t in enumerate(r.tokens, start=1):
            now = math.ceil((r.prompt + k) / block_size)
            if now != held:
                events.append((t, 0, now - held))
                held = now
        events.append((r.tokens[-1], 1, -held))
    total = peak = 0
    for _, _, d in sorted(events):
        total += d
        peak = max(peak, total)
    return float(peak * block_size)


def _summary(reqs: Sequence[Timed], span: float) -> dict[str, float]:
    tp = [r.tpot for r in reqs if r.out > 1]
    tt = [r.ttft for r in reqs]
    gaps = np.concatenate([np.diff(r.tokens) for r in reqs]) if reqs else np.zeros(0)
    return {
        "coalesced": float(np.mean(gaps <= 0.0)) if gaps.size else math.nan,  # tokens that came in one chunk
        "requests": len(reqs),
        "span_s": span,
        "req_s": len(reqs) / span,
        "tok_s": sum(r.out for r in reqs) / span,
        "tpot_p50": percentile(tp, 0.5),
        "tpot_p90": percentile(tp, 0.9),
        "ttft_p50": percentile(tt, 0.5),
        "ttft_p90": percentile(tt, 0.9),
        "mean_in": float(np.mean([r.prompt for r in reqs])),
        "mean_out": float(np.mean([r.out for r in reqs])),
    }


@attrs.frozen
class Target:
    """A running server: endpoint, served model name, key, vocabulary and longest sequence."""

    endpoint: str
    served: str
    api_key: str = ""
    vocab: int = 1024
    max_len: int = 1024
    log: str = ""
    block_size: int = 0
    """vLLM's KV block size, once read (``cache_config``); 0: closed runs do not rebuild the KV peak."""


def run_closed(
    tg: Target, concurrency: int, per_worker: int, mean_in: float, mean_out: float, seed: int
) -> dict[str, float]:
    """``concurrency`` workers, each sending ``per_worker`` requests back to back."""
    jobs = workload(seed, concurrency * per_worker, mean_in, mean_out, tg.max_len)

    def worker(w: int) -> list[Timed]:
        out = []
        for j in range(per_worker):
            i = w * per_worker + j
            p, o = jobs[i]
            out.append(stream_timed(tg.endpoint, tg.served, prompt_ids(seed, i, p, tg.vocab), o, api_key=tg.api_key))
        return out

    with Scraper(tg.endpoint, tg.api_key, log=tg.log) as sc, ThreadPoolExecutor(concurrency) as pool:
        t0 = time.monotonic()
        reqs = [r for f in [pool.submit(worker, w) for w in range(concurrency)] for r in f.result()]
        span = time.monotonic() - t0
    out = {"concurrency": concurrency, **_summary(reqs, span), **sc.steps()}
    if tg.block_size > 0:
        out["streams_peak_kv_tokens"] = kv_tokens_peak(reqs, tg.block_size)
    return out


def run_open(
    tg: Target, rate: float, duration_s: float, mean_in: float, mean_out: float, seed: int
) -> dict[str, float]:
    """Poisson arrivals at ``rate`` requests/s for ``duration_s`` (all of them waited for)."""
    rng = np.random.default_rng(seed)
    n = max(1, int(rng.poisson(rate * duration_s)))
    gaps = rng.exponential(1.0 / rate, n)
    jobs = workload(seed + 1, n, mean_in, mean_out, tg.max_len)
    with Scraper(tg.endpoint, tg.api_key, log=tg.log) as sc, ThreadPoolExecutor(min(n, 128)) as pool:
        t0 = time.monotonic()
        futs = []
        at = 0.0
        for i, ((p, o), g) in enumerate(zip(jobs, gaps, strict=True)):
            at += float(g)
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            ids = prompt_ids(seed, 10_000 + i, p, tg.vocab)
            futs.append(pool.submit(stream_timed, tg.endpoint, tg.served, ids, o, api_key=tg.api_key))
        reqs = [f.result() for f in futs]
        span = max(r.tokens[-1] for r in reqs) - t0
    return {"rate": rate, **_summary(reqs, span), **sc.steps()}


def run_ttft(tg: Target, prompts: Sequence[int], repeat: int, seed: int) -> list[dict[str, float]]:
    """Median TTFT of a lone request (one output token) per prompt length."""
    rows = []
    for i, p in enumerate(prompts):
        times = [
            stream_timed(
                tg.endpoint, tg.served, prompt_ids(seed, 20_000 + 100 * i + j, p, tg.vocab), 1, api_key=tg.api_key
            ).ttft
            for j in range(repeat)
        ]
        rows.append({"prompt": p, "ttft_p50": percentile(times, 0.5), "ttft_min": min(times)})
    return rows


def run_stall(
    tg: Target, streams: int, prompt: int, seed: int, lead_s: float = 1.0, out_tokens: int = 64
) -> dict[str, float]:
    """``streams`` decode streams of ``out_tokens`` run; after ``lead_s`` one request with a ``prompt``-token
    prompt arrives.
    Baseline: the median gap between the streams' tokens before it arrived. Stall: per stream, the time
    its tokens lost while the prompt was being processed (window minus tokens made in it times the
    baseline gap), the mean over the streams; and the longest single gap in the window."""
    with ThreadPoolExecutor(streams + 1) as pool:
        bg = [
            pool.submit(
                stream_timed,
                tg.endpoint,
                tg.served,
                prompt_ids(seed, 30_000 + s, 16, tg.vocab),
                out_tokens,
                api_key=tg.api_key,
            )
            for s in range(streams)
        ]
        time.sleep(lead_s)
        probe = stream_timed(tg.endpoint, tg.served, prompt_ids(seed, 31_000, prompt, tg.vocab), 2, api_key=tg.api_key)
        runs = [f.result() for f in bg]
    return {"streams": streams, "prompt": prompt, **stall(runs, probe.started, probe.tokens[0])}


def stall(runs: Sequence[Timed], w0: float, w1: float) -> dict[str, float]:
    """The decode streams' loss while a prompt ran from ``w0`` to its first token at ``w1`` (see
    ``run_stall``)."""
    lost, longest, base_all = [], 0.0, []
    for r in runs:
        t = np.asarray(r.tokens)
        before = np.diff(t[t < w0])
        if len(before) < 3 or t[-1] <= w1:
            raise PipelineMeasureError(
                f"stall: a decode stream made {len(before) + 1} tokens before the prompt or ended inside it; "
                "the measurement needs longer streams"
            )
        base = float(np.median(before))
        base_all.append(base)
        edges = np.concatenate([t[t < w0][-1:], t[(t >= w0) & (t <= w1)], t[t > w1][:1]])
        gaps = np.diff(edges)
        longest = max(longest, float(gaps.max()))
        lost.append(float(gaps.sum() - len(gaps) * base))
    return {
        "window_s": w1 - w0,
        "base_gap_s": float(np.median(base_all)),
        "stall_s": float(np.mean(lost)),
        "longest_gap_s": longest,
    }


__all__ = [
    "SERVER_ARGS",
    "SERVER_ENV",
    "TPOT_BUCKETS",
    "ModelInfo",
    "PipelineMeasureError",
    "Scraper",
    "Target",
    "Timed",
    "cache_config",
    "check_profile",
    "check_results",
    "check_split",
    "engine_log_stats",
    "gauge",
    "histogram",
    "histogram_quantile",
    "kv_bytes_per_block",
    "model_info",
    "parse_split",
    "percentile",
    "run_closed",
    "run_open",
    "run_stall",
    "run_ttft",
    "samples",
    "stall",
    "stream_timed",
    "workload",
]
