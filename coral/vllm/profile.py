"""``coral profile``: measure a model's per-layer times with a local vLLM server, as a profile table.

Prompt phase: one request per point with a prompt of ``x`` tokens and ``max_tokens=1``; its time to the
first token (median over ``repeat`` distinct prompts, so that no prefix cache helps) divided by the
model's layer count is the per-layer prompt time at ``x`` tokens in the batch. Decode phase: ``x``
concurrent requests with prompts of ``context`` tokens, each making ``steps + 1`` tokens; the median over
requests of (end - first token) / steps, divided by the layer count, is the per-layer decode time at batch
size ``x``. Two warm-up requests go first. The times include the server's per-step overheads (scheduling,
sampling, HTTP streaming), as a served request sees them: the perf model adds no overhead of its own to a
profiled (model, GPU, TP).

The table is written in ``coral.perf.profile``'s CSV format (``model,gpu,tp,phase,x,layer_s,context``),
which ``--profiles FILE`` feeds to the perf model.
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs

from coral.engines import StageAssignment
from coral.errors import CoralError
from coral.perf.profile import COLUMNS
from coral.vllm import client
from coral.vllm.engine import VllmBackend, VllmEngine, prompt_ids
from coral.vllm.tiny import chain_template, deployment_for


class ProfileRunError(CoralError):
    """A profile cannot be measured (bad arguments, a server that does not start or answer)."""


@attrs.frozen
class ProfileSpec:
    """What to measure: prompt sizes, batch sizes, the decode context and steps, repeats."""

    prompt_tokens: tuple[int, ...] = (16, 64, 256)
    batches: tuple[int, ...] = (1, 4, 16)
    context: int = 128
    steps: int = 16
    repeat: int = 3

    def check(self, max_len: int | None = None) -> ProfileSpec:
        for name in ("prompt_tokens", "batches"):
            v = getattr(self, name)
            if not v or any(x < 1 for x in v) or list(v) != sorted(set(v)):
                raise ProfileRunError(f"--{name.replace('_', '-')}: need increasing positive integers, got {list(v)}")
        for name in ("context", "steps", "repeat"):
            if getattr(self, name) < 1:
                raise ProfileRunError(f"--{name}: must be at least 1, got {getattr(self, name)}")
        if max_len is not None:
            need = max(max(self.prompt_tokens) + 1, self.context + self.steps + 1)
            if need > max_len:
                raise ProfileRunError(f"the longest request needs {need} tokens, the model allows {max_len}")
        return self


def model_layers(model_dir: Path) -> tuple[int, int, int]:
    """(layers, vocabulary, max positions) from a model directory's ``config.json``."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
    except OSError as e:
        raise ProfileRunError(f"--model: {model_dir}: cannot read config.json ({e.strerror})") from None
    except ValueError as e:
        raise ProfileRunError(f"--model: {model_dir}/config.json: not JSON ({e})") from None
    text = cfg.get("text_config", cfg)
    try:
        return int(text["num_hidden_layers"]), int(text["vocab_size"]), int(text.get("max_position_embeddings", 4096))
    except (KeyError, TypeError, ValueError):
        raise ProfileRunError(f"--model: {model_dir}/config.json lacks num_hidden_layers or vocab_size") from None


def measure(
    endpoint: str, served: str, layers: int, vocab: int, spec: ProfileSpec, *, seed: int = 0, api_key: str = ""
) -> list[tuple[str, int, float]]:
    """(phase, x, per-layer seconds) rows measured against a running server (whose key is ``api_key``)."""
    rows: list[tuple[str, int, float]] = []
    rid = 1 << 30  # request ids of the profile's own prompts
    for _ in range(2):  # warm-up: the first requests pay one-off allocations
        rid += 1
        client.stream_completion(
            endpoint, served, prompt_ids(seed, rid, spec.prompt_tokens[0], vocab), 2, api_key=api_key
        )
    for n in spec.prompt_tokens:
        times = []
        for _ in range(spec.repeat):
            rid += 1
            r = client.stream_completion(endpoint, served, prompt_ids(seed, rid, n, vocab), 1, api_key=api_key)
            times.append(r.first - r.started)
        rows.append(("prefill", n, max(statistics.median(times), 1e-9) / layers))
    with ThreadPoolExecutor(max(spec.batches)) as pool:
        for b in spec.batches:
            per: list[float] = []
            for _ in range(spec.repeat):
                prompts = []
                for _ in range(b):
                    rid += 1
                    prompts.append(prompt_ids(seed, rid, spec.context, vocab))
                futs = [
                    pool.submit(client.stream_completion, endpoint, served, p, spec.steps + 1, api_key=api_key)
                    for p in prompts
                ]
                for f in futs:
                    r = f.result()
                    per.append((r.ended - r.first) / spec.steps)
            rows.append(("decode", b, max(statistics.median(per), 1e-9) / layers))
    return rows


def write_table(
    path: Path, model: str, gpu: str, tp: int, context: int, rows: Sequence[tuple[str, int, float]]
) -> None:
    """Write rows in the profile-table CSV format."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for phase, x, t in rows:
            w.writerow([model, gpu, tp, phase, x, f"{t:.6g}", context])


def profile_model(
    model_dir: Path,
    out: Path,
    *,
    model: str,
    gpu: str,
    backend: VllmBackend,
    spec: ProfileSpec = ProfileSpec(),
    endpoint: str = "",
    served: str = "",
    api_key: str = "",
    say: Callable[[str], None] = lambda _s: None,
) -> list[tuple[str, int, float]]:
    """Measure ``model_dir`` with a vLLM server (started here, or the running one at ``endpoint``, whose key
    is ``api_key``) and write the table to ``out``; return its rows."""
    layers, vocab, max_pos = model_layers(model_dir)
    limit = backend.max_model_len or max_pos
    spec = spec.check(limit)
    tp = 1
    engine: VllmEngine | None = None
    if not endpoint:
        tpl = chain_template(model, [layers], node="profile", gpu=gpu, tp=tp)
        dep = deployment_for(tpl, served or "profile")
        engine = VllmEngine(attrs.evolve(backend, models={model: str(model_dir)}), "profile")
        engine.load(StageAssignment("profile", dep, tpl, 0, "local", True), 0.0)
        say(f"coral profile: starting vLLM ({backend.device}) for {model_dir} ...")
        t0 = time.monotonic()
        while not engine.loaded(time.monotonic() - t0):
            if engine.fault:
                raise ProfileRunError(f"the vLLM server did not start: {engine.fault}")
            time.sleep(0.5)
        endpoint, served = engine.endpoint, dep.name
        say(f"coral profile: server ready at {endpoint} after {time.monotonic() - t0:.0f} s; measuring")
    elif not served:
        raise ProfileRunError("--served-name: needed with --endpoint (the model name the server serves)")
    try:
        key = engine.api_key if engine is not None else api_key
        rows = measure(endpoint, served, layers, vocab, spec, seed=backend.seed, api_key=key)
    except client.HttpError as e:
        raise ProfileRunError(f"profile request failed: {e}") from None
    finally:
        if engine is not None:
            engine.stop(0.0)
    write_table(out, model, gpu, tp, spec.context, rows)
    return rows


__all__ = ["ProfileRunError", "ProfileSpec", "measure", "model_layers", "profile_model", "write_table"]
