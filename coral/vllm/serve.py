"""Run vLLM's OpenAI-compatible server (``python -m coral.vllm.serve ARGS``: the same arguments; with
``--headless``, a multi-node launch's follower node, as ``vllm serve --headless`` runs it).

This is ``python -m vllm.entrypoints.openai.api_server`` with a fix for a known vLLM bug applied first,
in this process and in every process vLLM starts from it (a spawned process imports this module again
as ``__mp_main__``; a forked one inherits the fix):

- vLLM 0.32.0 on CPU with ``enforce_eager`` and pipeline parallelism: the workers of the later pipeline
  stages never allocate their receive buffer (the CPU warm-up that would is skipped in eager mode), and
  the first request fails with ``assert self.intermediate_tensors is not None``. The fix allocates the
  buffer where it is first needed, exactly as vLLM's own dummy run would.

The fix applies only to the vLLM version that has the bug; any other version runs unchanged.

With an API key (``VLLM_API_KEY``, as ``coral.vllm.launch`` gives it), vLLM checks the key only on paths under
``/v1``, ``/v2``, ``/inference`` and ``/cohere``; its other routes (``/invocations``, ``/pause``,
``/abort_requests``, ``/metrics``, ...) would answer anyone. ``_guard_every_path`` makes its check cover
every path, ``/health`` included (the engine sends the key there too). With ``CORAL_VLLM_PARENT=PID`` the
server stops itself (its whole process group) when that process is gone, so that a crashed ``coral up``
leaves no server behind.
"""

from __future__ import annotations

from typing import Any

BUGGY_VERSIONS = ("0.32.0",)


def _fix_cpu_pp_eager() -> bool:
    try:
        import vllm
        from vllm.v1.worker import cpu_model_runner
    except Exception:  # not the CPU build, or no vLLM: nothing to fix
        return False
    if getattr(vllm, "__version__", "") not in BUGGY_VERSIONS:
        return False
    runner: Any = cpu_model_runner.CPUModelRunner
    original = runner.sync_and_gather_intermediate_tensors
    if getattr(original, "_coral_fix", False):
        return True

    def sync_and_gather_intermediate_tensors(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "intermediate_tensors", None) is None:
            self.intermediate_tensors = self.model.make_empty_intermediate_tensors(
                batch_size=self.max_num_tokens, dtype=self.model_config.dtype, device=self.device
            )
        return original(self, *args, **kwargs)

    sync_and_gather_intermediate_tensors._coral_fix = True  # type: ignore[attr-defined]
    runner.sync_and_gather_intermediate_tensors = sync_and_gather_intermediate_tensors
    return True


FIXED = _fix_cpu_pp_eager()


def _guard_every_path() -> bool:
    """Make vLLM's API-key middleware check every path (see the module docstring); False where this vLLM
    has no such middleware (its own check then applies as it is)."""
    try:
        from vllm.entrypoints.serve.middleware import authenticate
    except Exception:
        return False
    module: Any = authenticate  # typed as Any: the prefix tuple's declared length differs between versions
    if not hasattr(module, "GUARDED_PREFIX"):
        return False
    module.GUARDED_PREFIX = ("/",)
    return True


def _headless() -> None:
    """A multi-node launch's rank > 0: no HTTP server, only this node's workers (vLLM's ``serve --headless``;
    the api_server module itself would start an engine of its own on the follower node)."""
    from vllm.entrypoints.cli.serve import run_headless
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser(description="vLLM headless node")).parse_args()
    args.api_server_count = 0
    run_headless(args)


PARENT_ENV = "CORAL_VLLM_PARENT"
"""The pid of the process that started the server; when it is gone, the server stops itself."""


def _watch_parent(parent: int, grace_s: float = 30.0) -> None:
    """Stop this server's process group once ``parent`` is gone (it died without stopping the server)."""
    import os
    import signal
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.killpg(os.getpgrp(), signal.SIGTERM)
        time.sleep(grace_s)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="coral-parent-watch", daemon=True).start()


def main() -> None:
    """Run the server with this process's arguments (this module stays ``__main__``, so that the processes
    vLLM spawns import it, and its fix, again)."""
    import os
    import sys

    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit():
        _watch_parent(int(parent))

    if "--headless" in sys.argv[1:]:
        _headless()
        return
    if os.environ.get("VLLM_API_KEY"):
        _guard_every_path()
    try:
        from vllm.entrypoints.launchers.api_server.entry import main as serve
    except ImportError:  # another vLLM layout: its documented module entry point
        import runpy

        runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__")
        return
    serve()


if __name__ == "__main__":
    main()
