"""A tiny Llama-architecture model built offline and deterministically (tests and CPU trials of vLLM).

``build_tiny_model(out)`` trains a byte-level BPE tokenizer (vocabulary 1024) on seeded generated text and
saves a 4-layer Llama with seeded random weights (hidden 128, head_dim 32: the smallest head size vLLM's
CPU attention backend takes). Two builds with the same seed give byte-identical files. It needs
``transformers``, ``tokenizers`` and ``torch`` (all installed with vLLM); nothing is downloaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from coral.errors import CoralError
from coral.scenario import Demand, Deployment
from coral.templates import SINK, SOURCE, Route, Stage, Template, vllm_compatibility
from coral.workload import Slo, WorkloadShape

TINY_MODEL = "tiny-llama"
"""The catalog name of the tiny model (``fixtures/catalog/tiny-cpu.toml``)."""
VOCAB = 1024
HIDDEN = 128
INTERMEDIATE = 256
LAYERS = 4
HEADS = 4
HEAD_DIM = 32
MAX_POSITIONS = 2048
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
_WORDS = tuple(
    [
        "the",
        "a",
        "an",
        "of",
        "to",
        "in",
        "and",
        "or",
        "but",
        "on",
        "at",
        "by",
        "for",
        "with",
        "from",
        "over",
        "under",
        "model",
        "token",
        "layer",
        "cache",
        "batch",
        "prompt",
        "decode",
        "prefill",
        "node",
        "cloud",
        "price",
        "region",
        "stage",
        "worker",
        "plan",
        "route",
        "fleet",
        "serve",
        "queue",
        "time",
        "fast",
        "slow",
        "small",
        "large",
        "red",
        "green",
        "blue",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "alpha",
        "beta",
        "gamma",
        "delta",
    ]
)


class TinyModelError(CoralError):
    """The tiny model cannot be built (a missing package, an unusable output directory)."""


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(lines):
        n = int(rng.integers(4, 24))
        words = [_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), n)]
        nums = [str(int(x)) for x in rng.integers(0, 1000, 2)]
        out.append(" ".join(words + nums) + ".")
    return out


def build_tiny_model(out: str | Path, *, seed: int = 0) -> Path:
    """Build the tiny model into ``out`` (created; must be empty or hold a previous build); return it."""
    try:
        import torch
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    except ImportError as e:
        raise TinyModelError(f"tiny model: needs torch, transformers and tokenizers ({e})") from None
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise TinyModelError(f"--out: {path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not (path / "config.json").exists():
        raise TinyModelError(f"--out: {path} is not empty and holds no model; give a new or empty directory")
    path.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(str(path))

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):  # explicit, so that it does not follow library defaults
            if "norm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    model.config.dtype = torch.float32  # what vLLM's --dtype auto reads: keep the weights in fp32
    model.save_pretrained(str(path))
    (path / "coral-tiny.json").write_text(json.dumps({"name": TINY_MODEL, "seed": seed}) + "\n")
    return path


def chain_template(
    model: str,
    layers: Sequence[int],
    *,
    node: str = "cpu-local",
    gpu: str = "cpu",
    tp: int = 1,
    mode: str = "aggregated",
    template_id: str = "",
) -> Template:
    """A hand-made template: one chain of stages holding ``layers[i]`` consecutive layers each (for launches
    outside a solved store: tests, ``coral profile``)."""
    if not layers or any(k < 1 for k in layers):
        raise TinyModelError(f"layers: need at least one stage and at least one layer per stage, got {list(layers)}")
    stages = []
    start = 0
    for i, k in enumerate(layers):
        stages.append(Stage(i, node, gpu, tp, start, start + k, 1, 0.0, 0.0, 0.0))
        start += k
    n = len(stages)
    routes = [Route(SOURCE, 0, 1.0)] + [Route(i, i + 1, 1.0) for i in range(n - 1)] + [Route(n - 1, SINK, 1.0)]
    ok, reason = vllm_compatibility(stages, routes)
    return Template(
        id=template_id or f"{model}-{mode}-" + "-".join(str(k) for k in layers),
        model=model,
        num_layers=start,
        mode=mode,
        slo=Slo(10.0, 1.0),
        shape=WorkloadShape(64, 16),
        nodes=tuple(s.node for s in stages),
        stages=tuple(stages),
        routes=tuple(routes),
        prefill_tok_s=1.0,
        decode_tok_s=1.0,
        ttft_s=0.0,
        tpot_s=0.0,
        perf_version="",
        status="hand-made",
        gap=0.0,
        bound=0.0,
        method="hand-made",
        solve_s=0.0,
        vllm_ok=ok,
        vllm_reason=reason,
    )


def deployment_for(tpl: Template, name: str = "tiny") -> Deployment:
    """A deployment serving ``tpl``'s model at its SLO and shape (constant demand 1 req/s)."""
    return Deployment(name, tpl.model, tpl.slo, tpl.shape, Demand(series=((0.0, 1.0),)))


__all__ = ["TINY_MODEL", "TinyModelError", "build_tiny_model", "chain_template", "deployment_for"]
