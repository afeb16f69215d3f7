"""The OpenAI API surface the gateway speaks: request checks, error bodies, and the simulated replies.

Requests (``parse``): a JSON object with ``model`` (a deployment name), and ``prompt`` (completions: a
string, a list of strings, a list of token ids, or a list of such lists) or ``messages`` (chat: a non-empty
list of objects with a string ``role`` and a ``content`` string or list of text parts). ``max_tokens``
(chat also ``max_completion_tokens``) must be a positive integer; ``n`` must be 1; ``stream`` a boolean.
Anything else is passed through untouched to a real engine.

Simulated replies: the output is ``out`` placeholder words (one word per token), drawn from a fixed
vocabulary by a hash of (request id, position), so the same request id gives the same text. ``out`` is
``max_tokens`` when given, otherwise the deployment's mean output length. Prompt tokens are estimated as
the prompt's UTF-8 bytes / 4, rounded up (at least 1 per non-empty prompt; token-id prompts count their
ids); a chat adds 4 tokens per message for the role and separators, as chat templates do.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import msgspec

from coral.errors import CoralError
from coral.routing import uniform

BYTES_PER_TOKEN = 4
CHAT_MESSAGE_TOKENS = 4
WORDS = (
    "the", "coral", "reef", "grows", "slowly", "under", "warm", "light", "and", "every", "polyp", "builds",
    "a", "small", "stone", "cup", "while", "fish", "drift", "past", "in", "schools", "of", "silver",
)  # fmt: skip
encode_json = msgspec.json.Encoder().encode
"""JSON bytes of a value (msgspec)."""


class BadRequest(CoralError):
    """A request body the gateway refuses (HTTP 400); the message names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@attrs.frozen
class ApiRequest:
    """What the gateway needs of a request: its kind (``completions`` or ``chat``), model, stream flag,
    requested output length (None: not given) and estimated prompt tokens."""

    kind: str
    model: str
    stream: bool
    max_tokens: int | None
    prompt_tokens: int
    include_usage: bool


def estimate_tokens(text: str) -> int:
    """Estimated tokens of a text: its UTF-8 bytes / 4, rounded up."""
    return math.ceil(len(text.encode()) / BYTES_PER_TOKEN)


def _prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, str):
        return estimate_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return len(prompt)
        if all(isinstance(x, str) for x in prompt):
            return sum(estimate_tokens(x) for x in prompt)
        if all(isinstance(x, list) and x and all(isinstance(y, int) for y in x) for x in prompt):
            return sum(len(x) for x in prompt)
    raise BadRequest(
        "prompt: must be a string, a list of strings, a list of token ids or a list of token-id lists", "prompt"
    )


def _chat_tokens(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: must be a non-empty list of {role, content} objects", "messages")
    n = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest(f"messages[{i}]: must be an object with a string 'role'", "messages")
        content = m.get("content")
        if isinstance(content, str):
            n += estimate_tokens(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
                    raise BadRequest(f"messages[{i}].content: parts must be objects with a string 'text'", "messages")
                n += estimate_tokens(part.get("text", ""))
        elif content is not None:
            raise BadRequest(f"messages[{i}].content: must be a string or a list of parts", "messages")
        n += CHAT_MESSAGE_TOKENS
    return n


def parse(kind: str, body: bytes) -> ApiRequest:
    """Check a request body of ``kind`` (``completions`` or ``chat``); raise BadRequest naming the field."""
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError as e:
        raise BadRequest(f"body: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise BadRequest("body: must be a JSON object")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model: required, a non-empty string", "model")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream: must be true or false", "stream")
    n = data.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise BadRequest("n: only 1 is supported", "n")
    key = "max_tokens"
    mt = data.get("max_tokens")
    if kind == "chat" and mt is None:
        key, mt = "max_completion_tokens", data.get("max_completion_tokens")
    if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
        raise BadRequest(f"{key}: must be a positive integer, got {mt!r}", key)
    opts = data.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise BadRequest("stream_options: must be an object", "stream_options")
    usage = bool(opts.get("include_usage", False)) if opts else False
    if kind == "chat":
        tokens = _chat_tokens(data.get("messages"))
    else:
        if "prompt" not in data:
            raise BadRequest("prompt: required", "prompt")
        tokens = _prompt_tokens(data["prompt"])
    return ApiRequest(kind, model, stream, mt, tokens, usage)


def error_body(message: str, kind: str, code: int | str | None = None, param: str | None = None) -> bytes:
    """An OpenAI-style error body."""
    return encode_json({"error": {"message": message, "type": kind, "param": param, "code": code}})


def words(rid: int, start: int, end: int) -> str:
    """The placeholder text of tokens ``[start, end)`` of request ``rid`` (each token a word and a space
    before it, but for the very first)."""
    out = [WORDS[int(uniform(rid, k) * len(WORDS))] for k in range(start, end)]
    text = " ".join(out)
    return text if start == 0 or not text else " " + text


def usage(prompt: int, out: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}


def completion(req: ApiRequest, rid: int, out: int, created: int, finish: str) -> bytes:
    """The whole (non-streamed) response body."""
    text = words(rid, 0, out)
    if req.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish,
        }  # fmt: skip
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return encode_json(
        {
            "id": f"{_prefix(req)}-{rid}",
            "object": obj,
            "created": created,
            "model": req.model,
            "choices": [choice],
            "usage": usage(req.prompt_tokens, out),
        }
    )


def _prefix(req: ApiRequest) -> str:
    return "chatcmpl" if req.kind == "chat" else "cmpl"


def chunk(req: ApiRequest, rid: int, created: int, text: str, *, first: bool, finish: str | None) -> bytes:
    """One SSE event of a streamed response (``data: {...}`` and the blank line)."""
    if req.kind == "chat":
        delta: dict[str, Any] = {"content": text}
        if first:
            delta = {"role": "assistant", "content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    body: dict[str, Any] = {"id": f"{_prefix(req)}-{rid}", "object": obj, "created": created, "model": req.model}
    body["choices"] = [choice]
    return b"data: " + encode_json(body) + b"\n\n"


class TokenEvents:
    """The token events of one streamed response after its first, from a template encoded once: the same
    bytes as ``chunk(req, rid, created, text, first=False, finish=None)``, with only the text encoded per
    event."""

    def __init__(self, req: ApiRequest, rid: int, created: int) -> None:
        self.head, self.tail = chunk(req, rid, created, "\0", first=False, finish=None).rsplit(b'"\\u0000"', 1)

    def event(self, text: str) -> bytes:
        return self.head + encode_json(text) + self.tail


def usage_chunk(req: ApiRequest, rid: int, created: int, out: int) -> bytes:
    """The final usage event (``stream_options.include_usage``)."""
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    body = {
        "id": f"{_prefix(req)}-{rid}", "object": obj, "created": created, "model": req.model, "choices": [],
        "usage": usage(req.prompt_tokens, out),
    }  # fmt: skip
    return b"data: " + encode_json(body) + b"\n\n"


def error_event(message: str, kind: str) -> bytes:
    """An SSE error event (a stream that failed after its first byte)."""
    return b"data: " + error_body(message, kind) + b"\n\n"


DONE = b"data: [DONE]\n\n"
