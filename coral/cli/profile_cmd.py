"""``coral profile`` (measure per-layer times with vLLM into a profile table) and ``coral tiny-model``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console

from coral.catalog import Catalog
from coral.cli.common import catalog_from, print_json, warn
from coral.errors import CoralError

_ARCH = {
    "num_layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "intermediate": "intermediate_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "vocab": "vocab_size",
}
"""Catalog model fields and the ``config.json`` keys that hold them."""


def catalog_name(model_dir: Path, cat: Catalog) -> str:
    """The catalog's name for the model in ``model_dir``: the one whose Hugging Face id is the config's
    ``_name_or_path``, else the one whose architecture (layers, sizes, heads, vocabulary) it has."""
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CoralError(f"--model: {path}: cannot read the model's config ({e}); give --name") from None
    by_id = [m.name for m in cat.models.values() if m.hf_id and m.hf_id == config.get("_name_or_path")]
    if by_id:
        return by_id[0]
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    same = [m.name for m in cat.models.values() if all(getattr(m, f) == text.get(k) for f, k in _ARCH.items())]
    if len(same) == 1:
        return same[0]
    if same:
        raise CoralError(f"--model: {model_dir} matches several catalog models ({', '.join(same)}); give --name")
    raise CoralError(
        f"--model: {model_dir} matches no catalog model (by Hugging Face id or architecture); give --name, "
        "and --catalog FILE with its entry"
    )


def add(sub: Any, parent: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "profile",
        parents=[parent],
        help="measure a model's per-layer prompt and decode times with local vLLM into a profile table",
    )
    p.add_argument("--model", type=Path, required=True, metavar="DIR", help="the model's weights directory")
    p.add_argument("--out", type=Path, required=True, metavar="PROFILE.csv", help="the table to write")
    p.add_argument(
        "--name",
        default=None,
        help="the model's catalog name (default: the catalog model whose Hugging Face id or architecture "
        "matches DIR/config.json)",
    )
    p.add_argument(
        "--gpu", default=None, help="the catalog GPU type measured (default: cpu-avx512 on a CPU build of vLLM)"
    )
    p.add_argument("--prompt-tokens", default="16,64,256", help="prompt sizes, tokens (default: 16,64,256)")
    p.add_argument("--batches", default="1,4,16", help="decode batch sizes (default: 1,4,16)")
    p.add_argument("--context", type=int, default=128, help="decode context length, tokens (default: 128)")
    p.add_argument("--steps", type=int, default=16, help="decode steps timed per request (default: 16)")
    p.add_argument("--repeat", type=int, default=3, help="repeats per point (default: 3)")
    p.add_argument(
        "--vllm-device", default="auto", choices=("auto", "cpu", "gpu"), help="where vLLM runs (default: the build's)"
    )
    p.add_argument("--vllm-dir", type=Path, default=None, metavar="DIR", help="server logs and caches")
    p.add_argument(
        "--endpoint",
        default="",
        metavar="URL",
        help="measure a running vLLM server instead of starting one (its API key, if any, from $VLLM_API_KEY)",
    )
    p.add_argument("--served-name", default="", help="the model name the --endpoint server serves")
    p.add_argument("--json", action="store_true", help="print the measured rows as JSON")
    p.set_defaults(func=run_profile)

    t = sub.add_parser("tiny-model", help="build the tiny test model (offline, deterministic)")
    t.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory to write it to")
    t.add_argument("--seed", type=int, default=0, help="seed of the random weights (default: 0)")
    t.add_argument("--json", action="store_true", help="print where the model was written as JSON")
    t.set_defaults(func=run_tiny)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise CoralError(f"{flag}: expected comma-separated integers, got {text!r}") from None


def run_profile(args: argparse.Namespace) -> int:
    from coral.perf.profile import load_profiles
    from coral.vllm.engine import VllmBackend
    from coral.vllm.fleet import detect_device
    from coral.vllm.profile import ProfileSpec, profile_model

    con = Console(stderr=True)
    if not args.model.is_dir():
        raise CoralError(f"--model: {args.model} is not a directory")
    if args.out.exists() and args.out.is_dir():
        raise CoralError(f"--out: {args.out} is a directory")
    spec = ProfileSpec(
        _ints(args.prompt_tokens, "--prompt-tokens"),
        _ints(args.batches, "--batches"),
        args.context,
        args.steps,
        args.repeat,
    )
    cat = catalog_from(args)
    name = args.name or catalog_name(args.model, cat)
    device = detect_device(args.vllm_device, "coral profile")  # after the arguments' checks
    gpu = args.gpu or ("cpu-avx512" if device == "cpu" else None)
    if gpu is None:
        raise CoralError("--gpu: name the catalog GPU type being measured (for example h100-80g)")
    if name not in cat.models:
        warn(f"--name: {name!r} is no catalog model; the perf model will not use this table (give --catalog FILE)")
    work = (args.vllm_dir or Path.cwd() / ".coral-vllm").resolve()
    backend = VllmBackend(
        models={name: str(args.model)}, device=device, enforce_eager=device == "cpu", work_dir=str(work)
    )
    rows = profile_model(
        args.model,
        args.out,
        model=name,
        gpu=gpu,
        backend=backend,
        spec=spec,
        endpoint=args.endpoint,
        served=args.served_name,
        api_key=os.environ.get("VLLM_API_KEY", "") if args.endpoint else "",
        say=con.print,
    )
    load_profiles(args.out)  # what the perf model reads: fail here rather than later
    if args.json:
        print_json({"out": str(args.out), "model": name, "gpu": gpu,
                    "rows": [{"phase": ph, "x": x, "s_per_layer": t} for ph, x, t in rows]})  # fmt: skip
        return 0
    for phase, x, t in rows:
        con.print(f"  {phase:7s} x={x:<5d} {t * 1e3:8.3f} ms/layer")
    con.print(f"coral profile: wrote {args.out} ({len(rows)} rows, model {name}, gpu {gpu})")
    return 0


def run_tiny(args: argparse.Namespace) -> int:
    from coral.vllm.tiny import build_tiny_model

    if args.seed < 0:
        raise CoralError(f"--seed: must be >= 0, got {args.seed}")
    out = build_tiny_model(args.out, seed=args.seed)
    if args.json:
        print_json({"out": str(out), "seed": args.seed})
    else:
        print(f"coral tiny-model: wrote {out}")
    return 0
