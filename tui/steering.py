"""Steering: the forms an operator fills in (``ACTIONS``) and ``build_command``, which turns what was typed
into a control message after checking it against what the TUI has seen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from coral.messages import control as ctl
from coral.messages.inspect import PreviewRequest, TemplatesRequest
from tui.model import State, TemplateView


class FormError(ValueError):
    """Invalid input in a steering form: ``field`` names the form field, the message the reason."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


@attrs.frozen
class FieldSpec:
    """One input of a steering form. ``kind``: name, number or int; ``clearable``: the form's Clear sends the
    command with this field cleared (an override removed, a pin undone); blank is refused, never a clear."""

    name: str
    label: str
    kind: str = "name"
    clearable: bool = False
    placeholder: str = ""


@attrs.frozen
class ActionSpec:
    """A steering action: its key, title, form fields and a one-line help; ``confirm``: a yes/no question
    instead of a form; ``preview``: the allocator's preview of the next plan is shown before sending."""

    name: str
    key: str
    title: str
    help: str
    fields: tuple[FieldSpec, ...] = ()
    confirm: bool = False
    preview: bool = False
    clear_label: str = "Clear"

    @property
    def clearable(self) -> FieldSpec | None:
        """The field that Clear clears, if the action has one."""
        return next((f for f in self.fields if f.clearable), None)


ACTIONS: dict[str, ActionSpec] = {
    a.name: a
    for a in (
        ActionSpec(
            "demand", "d", "Override demand", "fix a deployment's demand (req/s); Clear removes the override",
            (FieldSpec("deployment", "Deployment"), FieldSpec("rps", "Demand (req/s)", "number", True)),
            clear_label="Clear override",
        ),
        ActionSpec(
            "availability", "a", "Set availability",
            "fix the nodes obtainable of (region, node type); 0 is a stockout; Clear removes the override",
            (FieldSpec("region", "Region"), FieldSpec("node", "Node type"),
             FieldSpec("count", "Nodes obtainable", "int", True)),
            clear_label="Clear override",
        ),
        ActionSpec(
            "price", "$", "Set price", "fix the price (USD per node-hour) of (region, node type); Clear removes it",
            (FieldSpec("region", "Region"), FieldSpec("node", "Node type"),
             FieldSpec("price", "Price ($/node-hour)", "number", True)),
            clear_label="Clear override",
        ),
        ActionSpec(
            "slo", "o", "Change SLO", "change a deployment's latency targets and attainment",
            (FieldSpec("deployment", "Deployment"), FieldSpec("ttft_s", "TTFT target (s)", "number"),
             FieldSpec("tpot_s", "TPOT target (s)", "number"),
             FieldSpec("attainment", "Attainment (0-1]", "number", False, "0.9")),
        ),
        ActionSpec(
            "forbid", "f", "Forbid template", "stop the allocator from planning a template",
            (FieldSpec("template_id", "Template id (or prefix)"),), preview=True,
        ),
        ActionSpec(
            "allow", "l", "Allow template", "let the allocator plan a forbidden template again",
            (FieldSpec("template_id", "Template id (or prefix)"),), preview=True,
        ),
        ActionSpec(
            "pin", "n", "Pin template", "serve a deployment only with one aggregated template; Clear unpins",
            (FieldSpec("deployment", "Deployment"), FieldSpec("template_id", "Template id (or prefix)", "name", True)),
            preview=True, clear_label="Unpin",
        ),
        ActionSpec("drain", "x", "Drain instance", "drain and stop one instance", (FieldSpec("instance", "Instance"),)),
        ActionSpec("replan", "r", "Re-plan now", "ask the allocator to re-plan now (within a hop)", confirm=True),
        ActionSpec("pause", "p", "Pause/resume allocator", "pause the allocator (no new plans), or resume it",
                   confirm=True),
        ActionSpec(
            "churn", "c", "Set churn penalty", "set the churn-penalty factor (0 disables the start-up penalty)",
            (FieldSpec("factor", "Churn-penalty factor", "number"),),
        ),
    )
}  # fmt: skip


def suggestions(state: State, field: str, values: Mapping[str, str] | None = None) -> list[str]:
    """Known names for a form field (for completion), given what the form holds so far."""
    vals = values or {}
    if field == "deployment":
        return sorted(state.deployments)
    if field == "region":
        return list(state.regions)
    if field == "node":
        region = vals.get("region", "").strip()
        return sorted({n for r, n in state.market if not region or r == region})
    if field == "template_id":
        return state.known_templates()
    if field == "instance":
        return sorted((i.id for i in state.instances.values() if i.drainable), key=_natural)
    return []


def template_choices(state: State, action: str, values: Mapping[str, str]) -> list[TemplateView]:
    """The templates a pin, forbid or allow form lists: for a pin, the deployment's aggregated templates
    that the allocator may plan; to forbid, the allowed templates (of the deployment, if one is named);
    to allow, the forbidden ones. Cheapest capacity first is not known here: by mode, then capacity."""
    dep = state.deployments.get(str(values.get("deployment", "")).strip())

    def serves(t: TemplateView) -> bool:
        if dep is None:
            return True
        return t.deployment == dep.name if t.deployment else (not dep.model or t.model == dep.model)

    ts = [t for t in state.templates.values() if serves(t)]
    if action == "pin":
        ts = [t for t in ts if t.mode == "aggregated" and t.usable and t.id not in state.forbidden]
    elif action == "forbid":
        ts = [t for t in ts if t.id not in state.forbidden]
    elif action == "allow":
        ts = [t for t in ts if t.id in state.forbidden]
    else:
        return []
    return sorted(ts, key=lambda t: (t.mode != "aggregated", t.mode, -t.capacity_rps, t.id))


INSPECTOR = ctl.ALLOCATOR
"""Who answers the TUI's inspection requests (templates, the scenario, plan previews)."""


def templates_request(ids: Sequence[str], deployment: str = "") -> TemplatesRequest:
    """Ask for the templates ``ids`` and every template of ``deployment`` (with mode, nodes, capacity)."""
    return TemplatesRequest(tuple(ids), deployment)


def preview_of(cmd: Any) -> PreviewRequest | None:
    """The preview the allocator is asked for before ``cmd`` is sent (pin, unpin, forbid, allow), or None."""
    if isinstance(cmd, ctl.PinTemplate):
        return PreviewRequest("pin" if cmd.template_id else "unpin", cmd.template_id or "", cmd.deployment)
    if isinstance(cmd, ctl.ForbidTemplate):
        return PreviewRequest("forbid" if cmd.forbid else "allow", cmd.template_id)
    return None


def defaults(state: State, action: str, context: Mapping[str, str] | None = None) -> dict[str, str]:
    """Initial form values: the selection the form was opened from, and for a field that Clear does not
    clear (SLO targets, churn factor) its current setting. A clearable field starts blank: its current
    value is shown beside the form (``current``), so that a blank field is never mistaken for a clear."""
    ctx = dict(context or {})
    out = {f.name: ctx.get(f.name, "") for f in ACTIONS[action].fields}
    now: dict[str, str] = {}
    dep = state.deployments.get(out.get("deployment", ""))
    if action == "slo":
        slo = dep.slo if dep is not None else None
        now["attainment"] = "0.9"
        if slo is not None:
            now.update(ttft_s=f"{slo.ttft_s:g}", tpot_s=f"{slo.tpot_s:g}", attainment=f"{slo.attainment:g}")
        elif dep is not None:  # no scenario from the mesh: the targets of a template it runs
            tpl = next((state.templates[t] for t, _ in dep.templates if t in state.templates), None)
            if tpl is not None and tpl.ttft_s > 0:
                now.update(ttft_s=f"{tpl.ttft_s:g}", tpot_s=f"{tpl.tpot_s:g}")
    if action == "churn" and state.churn is not None:
        now["factor"] = f"{state.churn:g}"
    if action == "pin" and out.get("template_id") and dep is not None and dep.pinned == out["template_id"]:
        out["template_id"] = ""  # opened on the pinned template itself: pinning it again changes nothing
    return {k: v or now.get(k, "") for k, v in out.items()}


def current(state: State, action: str, values: Mapping[str, str]) -> str:
    """What the setting a form changes is now, in words (empty before its key fields are filled in)."""
    v = {k: str(x).strip() for k, x in values.items()}
    dep = state.deployments.get(v.get("deployment", ""))
    q = state.market.get((v.get("region", ""), v.get("node", "")))
    if action == "demand" and dep is not None:
        if dep.override:
            return f"now {dep.demand:g} req/s, fixed by an operator (Clear removes the override)"
        return f"now {dep.demand:g} req/s from the demand monitor; no override"
    if action in ("availability", "price") and q is not None:
        what = f"{q.availability} nodes" if action == "availability" else f"${q.price:g}/node-hour"
        return f"now {what}, " + ("fixed by an operator (Clear removes it)" if q.overridden else "from the market")
    if action == "slo" and dep is not None and dep.slo is not None:
        s = dep.slo
        return f"now TTFT {s.ttft_s:g} s, TPOT {s.tpot_s:g} s, attainment {s.attainment:g}"
    if action == "pin" and dep is not None:
        return f"now pinned to {dep.pinned[:12]} (Unpin clears it)" if dep.pinned else "now not pinned"
    if action in ("forbid", "allow"):
        tid = state.resolve_template(v.get("template_id", "")) if v.get("template_id") else None
        n = len(state.forbidden)
        if tid is not None:
            return f"{tid[:12]} is now {'forbidden' if tid in state.forbidden else 'allowed'} ({n} forbidden)"
        return f"{n} template{'s' if n != 1 else ''} forbidden now"
    if action == "churn" and state.churn is not None:
        return f"now {state.churn:g}"
    return ""


def _number(field: str, text: str, *, integer: bool = False) -> float:
    try:
        v = int(text) if integer else float(text)
    except ValueError:
        raise FormError(field, f"expected {'a whole number' if integer else 'a number'}, got {text!r}") from None
    if not math.isfinite(v):
        raise FormError(field, f"must be finite, got {text!r}")
    if v < 0:
        raise FormError(field, f"must not be negative, got {text}")
    return v


def _known(field: str, text: str, known: Sequence[str], what: str) -> str:
    if not text:
        raise FormError(field, "required")
    if text in known:
        return text
    if not known:
        raise FormError(field, f"no {what} known yet (nothing received from the mesh); cannot check {text!r}")
    shown = ", ".join(known[:8]) + (", ..." if len(known) > 8 else "")
    raise FormError(field, f"unknown {what} {text!r} (known: {shown})")


def build_command(state: State, action: str, values: Mapping[str, str], *, clear: bool = False, ref: int = 0) -> Any:
    """The control message for a filled-in form; raises FormError (field, reason) on invalid input.

    ``clear``: the form's Clear, which sends the command with its clearable field cleared (whatever that
    field holds); otherwise a blank field is refused. Names are checked against what the TUI has seen
    (deployments, market entries, templates, live instances), numbers against their range, and the
    message's own ``problems()`` last.
    """
    if action not in ACTIONS:
        raise FormError("action", f"unknown action {action!r} (known: {', '.join(ACTIONS)})")
    spec = ACTIONS[action]
    v = {k: str(x).strip() for k, x in values.items()}
    cf = spec.clearable
    if clear and cf is None:
        raise FormError("action", f"{spec.title} has nothing to clear")
    if cf is not None:
        if clear:
            v[cf.name] = ""
        elif not v.get(cf.name):
            raise FormError(cf.name, f"required (to remove the current setting, use {spec.clear_label})")

    def get(name: str) -> str:
        return v.get(name, "")

    cmd: Any
    if action == "demand":
        dep = _known("deployment", get("deployment"), sorted(state.deployments), "deployment")
        cmd = ctl.SetDemand(dep, _number("rps", get("rps")) if get("rps") else None, ref)
    elif action in ("availability", "price"):
        region = _known("region", get("region"), list(state.regions), "region")
        offered = sorted(n for r, n in state.market if r == region)
        node = _known("node", get("node"), offered, f"node type offered in {region}:")
        if action == "availability":
            count = int(_number("count", get("count"), integer=True)) if get("count") else None
            cmd = ctl.SetAvailability(region, node, count, ref)
        else:
            price = _number("price", get("price")) if get("price") else None
            if price is not None and price <= 0:
                raise FormError("price", f"must be positive, got {get('price')}")
            cmd = ctl.SetPrice(region, node, price, ref)
    elif action == "slo":
        dep = _known("deployment", get("deployment"), sorted(state.deployments), "deployment")
        nums = {}
        for f in ("ttft_s", "tpot_s", "attainment"):
            if not get(f):
                raise FormError(f, "required")
            nums[f] = _number(f, get(f))
            if nums[f] <= 0:
                raise FormError(f, f"must be positive, got {get(f)}")
        if nums["attainment"] > 1:
            raise FormError("attainment", f"must be at most 1, got {get('attainment')}")
        cmd = ctl.SetSlo(dep, nums["ttft_s"], nums["tpot_s"], nums["attainment"], ref)
    elif action in ("forbid", "allow"):
        cmd = ctl.ForbidTemplate(_template(state, get("template_id")), action == "forbid", ref)
    elif action == "pin":
        dep = _known("deployment", get("deployment"), sorted(state.deployments), "deployment")
        pin = _template(state, get("template_id")) if get("template_id") else None
        if pin is not None and pin in state.templates:
            t = state.templates[pin]
            dmodel = state.deployments[dep].model
            if dmodel and t.model != dmodel:
                raise FormError("template_id", f"template {pin[:12]} serves {t.model}, not {dep}'s model {dmodel}")
            if t.mode != "aggregated":
                raise FormError("template_id", f"template {pin[:12]} is a {t.mode} template; pin an aggregated one")
        cmd = ctl.PinTemplate(dep, pin, ref)
    elif action == "drain":
        live = sorted((i.id for i in state.instances.values() if i.drainable), key=_natural)
        inst = get("instance")
        if inst in state.instances and inst not in live:
            raise FormError("instance", f"instance {inst} is {state.instances[inst].state}, not running")
        cmd = ctl.DrainInstance(_known("instance", inst, live, "running instance"), ref)
    elif action == "replan":
        cmd = ctl.Replan("operator", ref)
    elif action == "pause":
        cmd = ctl.PauseAllocator(not state.paused, ref)
    else:  # churn
        if not get("factor"):
            raise FormError("factor", "required")
        cmd = ctl.SetChurn(_number("factor", get("factor")), ref)
    bad = cmd.problems()
    if bad is not None:
        raise FormError(*bad)
    return cmd


def _natural(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return (head, int(tail) if tail else -1)


def _template(state: State, text: str) -> str:
    if not text:
        raise FormError("template_id", "required")
    tid = state.resolve_template(text)
    if tid is not None:
        return tid
    known = state.known_templates()
    if not known:
        raise FormError("template_id", f"no templates known yet (nothing from the mesh); cannot check {text!r}")
    if sum(1 for t in known if t.startswith(text)) > 1:
        raise FormError("template_id", f"prefix {text!r} matches several templates; type more of the id")
    raise FormError("template_id", f"unknown template {text!r} ({len(known)} known)")


def describe_command(cmd: Any) -> str:
    """A short human description of a control message."""
    if isinstance(cmd, ctl.SetDemand):
        return f"demand {cmd.deployment} = " + ("clear" if cmd.rps is None else f"{cmd.rps:g} req/s")
    if isinstance(cmd, ctl.SetAvailability):
        return f"availability {cmd.region}/{cmd.node} = " + ("clear" if cmd.count is None else str(cmd.count))
    if isinstance(cmd, ctl.SetPrice):
        return f"price {cmd.region}/{cmd.node} = " + ("clear" if cmd.price is None else f"${cmd.price:g}/h")
    if isinstance(cmd, ctl.SetSlo):
        return f"SLO {cmd.deployment} = TTFT {cmd.ttft_s:g}s TPOT {cmd.tpot_s:g}s @ {cmd.attainment:g}"
    if isinstance(cmd, ctl.ForbidTemplate):
        return f"{'forbid' if cmd.forbid else 'allow'} template {cmd.template_id[:12]}"
    if isinstance(cmd, ctl.PinTemplate):
        return f"pin {cmd.deployment} to " + ("nothing (unpin)" if cmd.template_id is None else cmd.template_id[:12])
    if isinstance(cmd, ctl.DrainInstance):
        return f"drain {cmd.instance}"
    if isinstance(cmd, ctl.Replan):
        return "re-plan now"
    if isinstance(cmd, ctl.PauseAllocator):
        return "pause allocator" if cmd.paused else "resume allocator"
    if isinstance(cmd, ctl.SetChurn):
        return f"churn factor = {cmd.factor:g}"
    if isinstance(cmd, ctl.SetSpeed):
        return "speed = " + ("as fast as possible" if cmd.speed is None else f"x{cmd.speed:g}")
    return type(cmd).__name__


def owner_of(cmd: Any) -> str:
    """The actor that owns a command's setting (the pace is the ``operator`` gateway's driver's)."""
    return ctl.OPERATOR if isinstance(cmd, ctl.SetSpeed) else ctl.owner_of(cmd)


def speed_command(state: State, factor: float, bounds: tuple[float, float]) -> ctl.SetSpeed | None:
    """The live mesh's speed times ``factor`` (within ``bounds``, 4 significant digits), or None while the
    speed is not known (an unpaced run, or no ``ClockInfo`` yet)."""
    if state.speed <= 0:
        return None
    return ctl.SetSpeed(float(f"{min(bounds[1], max(bounds[0], state.speed * factor)):.4g}"))
