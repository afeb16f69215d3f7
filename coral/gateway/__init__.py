"""The OpenAI-compatible HTTP gateway: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, ``/health``.

Stack: a raw ASGI application served by uvicorn (httptools parser) in the mesh's own event loop (anyio on
asyncio); upstream calls use a small keep-alive HTTP/1.1 client on httptools (``coral.gateway.client``).
``coral up --gateway HOST:PORT`` runs it.

Routing: a request's ``model`` is a deployment name (as the scenario names it; ``/v1/models`` lists them).
The gateway keeps a routing table from the bus's ``fleet.update``: per deployment, the routable entry
instances and their plan weights (capacity in req/s). It picks one by weight with a seeded hash draw of
(seed, request id, attempt), as the router does. Then:

- an instance with an ``endpoint`` (its engine serves HTTP itself, as vLLM's OpenAI server does): the
  request body is sent there unchanged (the engine must serve the deployment's name as its model, e.g.
  vLLM's ``--served-model-name``) and the response streamed back as it comes, SSE included. When the
  instance fails before its first byte (connection refused or reset), the request is retried once on
  another instance. Such arrivals are counted for the demand monitor through the router
  (``req.proxied``), so the demand estimate sees them as it sees the router's own;
- a simulated instance (no endpoint): the request enters the mesh as an arrival of the router (delivered
  at the mesh's next quiet point, like the input feed's, which a paced run makes at once: the request
  rings the mesh's doorbell; the router places it by its own draw), and the simulated engine's timing
  decides when its tokens come: a plain request is answered at its completion, a streamed one gets each
  token as the head worker reports it, at the engine's time of that token. The text is placeholder
  words seeded by the request id; usage counts the requested output and the estimated prompt (see
  ``coral.gateway.openai``). Timing follows the run's pace (``coral up --speed``): at 60x a simulated
  second is 1/60 s of wall time.

Errors are OpenAI-style JSON: 400 (malformed body, naming the field; or a simulated request too long for
the instance's KV cache), 404 (unknown model or path), 503 with ``Retry-After`` (the model has no live
instance, or its request failed in the fleet before its first byte), 429 with ``Retry-After`` (more than
``max_active`` requests in progress and ``max_queue`` waiting), 502 (both instances tried failed).

Access (``coral.gateway.auth``, given as ``Gateway(auth=...)``): once the key file lists a key, every
``/v1/...`` request needs ``Authorization: Bearer KEY`` (401 without a valid one, 403 for a model outside
the key's list, 429 with ``Retry-After`` over its rate), and each proxied request carries its engine's key.
"""

from coral.gateway.app import GATEWAY_ID_BASE, Gateway, GatewayError
from coral.gateway.link import MeshLink
from coral.gateway.server import parse_address, serving

__all__ = ["GATEWAY_ID_BASE", "Gateway", "GatewayError", "MeshLink", "parse_address", "serving"]
