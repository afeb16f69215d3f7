"""Per-model service targets and request shapes."""

from __future__ import annotations

import attrs

MODES = ("aggregated", "prefill", "decode")


def _positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attr.name} must be positive, got {value}")


@attrs.frozen
class Slo:
    """Latency targets: time to first token, time per output token, and the attainment target."""

    ttft_s: float = attrs.field(validator=_positive)
    tpot_s: float = attrs.field(validator=_positive)
    attainment: float = 0.9

    def __attrs_post_init__(self) -> None:
        if not 0 < self.attainment <= 1:
            raise ValueError(f"attainment must be in (0, 1], got {self.attainment}")

    @property
    def key(self) -> str:
        return f"ttft{self.ttft_s:g}-tpot{self.tpot_s:g}-p{self.attainment:g}"


@attrs.frozen
class WorkloadShape:
    """Mean prompt and output lengths of a model's requests, in tokens."""

    mean_in: float = attrs.field(validator=_positive)
    mean_out: float = attrs.field(validator=_positive)

    @property
    def mean_context(self) -> float:
        """Mean KV length while decoding: the prompt plus half the output."""
        return self.mean_in + self.mean_out / 2

    @property
    def max_context(self) -> float:
        """KV length at the end of a mean request, used to size memory."""
        return self.mean_in + self.mean_out
