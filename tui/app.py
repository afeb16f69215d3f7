"""The Coral terminal UI: watch and steer a live mesh, or replay a recorded journal.

The app is thin: it holds the current ``State`` (``tui.state``), folds what the bus worker
(``tui.bus.BusWorker``) posts into it, redraws the header and the visible view, and turns the views'
requests into steering forms and control messages. ``run_tui`` runs it; ``make_app`` builds it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from coral.kernel import ClientKeys, Endpoints
from tui import state as S
from tui.bus import (
    BusBatch,
    BusWorker,
    CommandDone,
    LinkChanged,
    LiveSource,
    ReplaySource,
    Source,
    TemplateLookup,
    check_speed,
    default_endpoints,
)
from tui.screens.confirm import ConfirmScreen
from tui.screens.form import CommandForm
from tui.screens.plan import PlanScreen
from tui.screens.steer import SteerMenu
from tui.widgets.events import EventsView
from tui.widgets.fleet import FleetView
from tui.widgets.header import StatusHeader
from tui.widgets.market import MarketView
from tui.widgets.models import ModelsView
from tui.widgets.plans import PlansView

VIEWS = (
    ("fleet", "1 Fleet"),
    ("models", "2 Models"),
    ("market", "3 Market"),
    ("plans", "4 Plans"),
    ("events", "5 Events"),
)
STEER_ACTIONS = frozenset({"steer", "replan", "pause", "steer_menu"})
REPLAY_ACTIONS = frozenset({"replay_pause", "replay_speed"})


class CoralTui(App[int]):
    """Fleet, Models, Market, Plans and Events views under a header; steering through forms."""

    CSS_PATH = "app.tcss"
    TITLE = "Coral"
    BINDINGS: ClassVar[list[BindingType]] = [
        *(Binding(str(i + 1), f"view('{vid}')", label, show=False) for i, (vid, label) in enumerate(VIEWS)),
        Binding("s", "steer_menu", "Steer"),
        Binding("r", "replan", "Re-plan"),
        Binding("p", "pause", "Pause/resume"),
        *(Binding(a.key if a.key != "$" else "dollar_sign", f"steer('{a.name}')", a.title, show=False)
          for a in S.ACTIONS.values() if a.name not in ("replan", "pause")),
        Binding("space", "replay_pause", "Pause replay"),
        Binding("left_square_bracket", "replay_speed(0.5)", "Slower", key_display="["),
        Binding("right_square_bracket", "replay_speed(2.0)", "Faster", key_display="]"),
        Binding("q", "quit", "Quit"),
    ]  # fmt: skip

    def __init__(
        self,
        source: Source,
        *,
        gpu_of: Mapping[str, str] | None = None,
        store: Path | None = None,
        frame_s: float = 0.05,
    ) -> None:
        super().__init__()
        self.source = source
        self.state = S.initial_state(gpu_of=gpu_of, link=S.Link("connecting", "", source.address))
        self.bus = BusWorker(source, self.post_message, frame_s=frame_s)
        self.templates = TemplateLookup(store)
        self.batches = 0
        self.blink = True
        """Whether text inputs blink their cursor (tests turn it off for stable snapshots)."""

    def compose(self) -> ComposeResult:
        yield StatusHeader(id="status")
        with TabbedContent(initial="fleet", id="views"):
            with TabPane(VIEWS[0][1], id="fleet"):
                yield FleetView(id="fleet-view")
            with TabPane(VIEWS[1][1], id="models"):
                yield ModelsView(id="models-view")
            with TabPane(VIEWS[2][1], id="market"):
                yield MarketView(id="market-view")
            with TabPane(VIEWS[3][1], id="plans"):
                yield PlansView(id="plans-view")
            with TabPane(VIEWS[4][1], id="events"):
                yield EventsView(id="events-view")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        base = self.screen  # the views live on the default screen; modal screens come and go above it
        self._header = base.query_one("#status", StatusHeader)
        self._tabs = base.query_one("#views", TabbedContent)
        self._views: dict[str, Any] = {vid: base.query_one(f"#{vid}-view") for vid, _ in VIEWS}
        self.redraw(all_views=True)
        self._focus_view("fleet")
        self.run_worker(self.bus.run(), name="bus", group="bus", exit_on_error=False)

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        if not self.blink and isinstance(event.widget, Input):
            event.widget.cursor_blink = False

    # -- drawing -----------------------------------------------------------------------------------

    @property
    def active_view(self) -> str:
        return self._tabs.active or "fleet"

    def redraw(self, *, all_views: bool = False) -> None:
        """Draw the header and the visible view (or every view)."""
        if not hasattr(self, "_header"):
            return
        try:
            self._header.show(self.state)
            ids = [v for v, _ in VIEWS] if all_views else [self.active_view]
            for vid in ids:
                self._views[vid].show(self.state)
        except NoMatches:  # only while the app closes: its widgets are going away under a late message
            return

    def _focus_view(self, vid: str) -> None:
        tables = self._views[vid].query(DataTable)
        if tables:
            tables.last().focus() if vid == "fleet" else tables.first().focus()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.redraw()
        self._focus_view(self.active_view)

    # -- the bus -----------------------------------------------------------------------------------

    def on_bus_batch(self, message: BusBatch) -> None:
        st = S.apply_all(self.state, message.envelopes)
        st = S.with_dropped(st, message.dropped)
        missing = S.missing_templates(st)
        if missing:
            found = self.templates.fetch(missing)
            if found:
                st = S.add_templates(st, found)
        self.state = st
        self.batches += 1
        self.redraw()
        self.bus.ack()

    def on_link_changed(self, message: LinkChanged) -> None:
        self.state = S.with_link(self.state, message.link)
        self.redraw()

    def on_command_done(self, message: CommandDone) -> None:
        self.state = S.note_result(self.state, message.n, message.cmd, message.result, message.error)
        text = S.describe_command(message.cmd)
        r = message.result
        if r is None:
            self.notify(f"{text}: {message.error}", title="not sent", severity="error")
        elif r.ok:
            self.notify(f"{text}: accepted by {r.owner}", title="confirmed")
        else:
            self.notify(f"{text}: {r.field}: {r.reason}", title=f"refused by {r.owner}", severity="warning")
        self.redraw()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.name == "bus" and event.state == WorkerState.ERROR:
            err = event.worker.error
            self.state = S.with_link(self.state, S.Link("lost", f"bus worker failed: {err}", self.source.address))
            self.notify(str(err), title="bus worker failed", severity="error", timeout=30)
            self.redraw()

    # -- steering ----------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if isinstance(self.screen, ModalScreen) and (action in STEER_ACTIONS or action == "view"):
            return False
        if action in STEER_ACTIONS:
            return not self.source.read_only
        if action in REPLAY_ACTIONS:
            return self.source.read_only
        return True

    def action_view(self, vid: str) -> None:
        self._tabs.active = vid
        self._focus_view(vid)  # now, not on TabActivated: the next key must find the view's table focused

    def action_steer_menu(self) -> None:
        def chosen(name: str | None) -> None:
            if name:
                self.action_steer(name)

        self.push_screen(SteerMenu(), chosen)

    def action_replan(self) -> None:
        self.action_steer("replan")

    def action_pause(self) -> None:
        self.action_steer("pause")

    def action_steer(self, name: str, context: Mapping[str, str] | None = None) -> None:
        """Open the form (or the confirmation) of a steering action, prefilled from ``context``."""
        if self.source.read_only:
            self.notify("replay is read-only", severity="warning")
            return
        spec = S.ACTIONS[name]
        if spec.confirm:
            try:
                cmd = S.build_command(self.state, name, {})
            except S.FormError as exc:
                self.notify(str(exc), title=spec.title, severity="warning")
                return
            question = f"{S.describe_command(cmd).capitalize()}?"

            def answered(yes: bool | None) -> None:
                if yes:
                    self.send_command(name, cmd)

            self.push_screen(ConfirmScreen(spec.title, question), answered)
            return

        def filled(cmd: Any) -> None:
            if cmd is not None:
                self.send_command(name, cmd)

        self.push_screen(CommandForm(lambda: self.state, name, S.defaults(self.state, name, context)), filled)

    def send_command(self, action: str, cmd: Any) -> None:
        """Put a control message on the bus; its answer comes back as ``CommandDone``."""
        self.state, n = S.note_sent(self.state, action, cmd)
        self.notify(f"{S.describe_command(cmd)}", title="sent")
        self.bus.submit(n, cmd)
        self.redraw()

    def on_fleet_view_drain_requested(self, message: FleetView.DrainRequested) -> None:
        self.action_steer("drain", {"instance": message.instance})

    def on_models_view_steer_deployment(self, message: ModelsView.SteerDeployment) -> None:
        self.action_steer(message.action, {"deployment": message.deployment})

    def on_market_view_steer_entry(self, message: MarketView.SteerEntry) -> None:
        self.action_steer(message.action, {"region": message.region, "node": message.node})

    def on_plans_view_plan_chosen(self, message: PlansView.PlanChosen) -> None:
        plan = self.state.plan(message.n)
        if plan is not None:
            self.push_screen(PlanScreen(self.state, plan))

    def on_plan_screen_template_action(self, message: PlanScreen.TemplateAction) -> None:
        self.action_steer(message.action, {"template_id": message.template_id, "deployment": message.deployment})

    # -- replay ------------------------------------------------------------------------------------

    def action_replay_pause(self) -> None:
        if isinstance(self.source, ReplaySource):
            self.source.set_paused(not self.source.paused)
            if self.state.link.state == "replay":
                self.state = S.with_link(self.state, self.source.link_state())
            self.redraw()

    def action_replay_speed(self, factor: float) -> None:
        if isinstance(self.source, ReplaySource):
            self.source.set_speed(min(1e6, max(1e-3, self.source.speed * factor)))
            if self.state.link.state == "replay":
                self.state = S.with_link(self.state, self.source.link_state())
            self.redraw()


def _gpu_of(catalog_files: list[Path] | None = None) -> dict[str, str]:
    from coral.catalog import load_catalog

    cat = load_catalog(list(catalog_files or []))
    return {name: n.gpu for name, n in cat.nodes.items()}


def make_app(
    endpoints: Endpoints | None = None,
    *,
    replay: str | os.PathLike[str] | None = None,
    speed: float = 1.0,
    store: Path | None = None,
    catalog_files: list[Path] | None = None,
    source: Source | None = None,
    curve: ClientKeys | None = None,
) -> CoralTui:
    """The app for a live mesh (``endpoints``, or the local default), a journal (``replay``) or a source."""
    if source is None:
        if replay is not None:
            source = ReplaySource(replay, speed=check_speed(speed))
        else:
            source = LiveSource(endpoints if endpoints is not None else default_endpoints(), curve=curve)
    if store is None:
        from coral.store import default_store_path

        store = default_store_path()
    return CoralTui(source, gpu_of=_gpu_of(catalog_files), store=store)


def run_tui(
    endpoints: Endpoints | None = None,
    *,
    replay: str | os.PathLike[str] | None = None,
    speed: float = 1.0,
    store: Path | None = None,
    catalog_files: list[Path] | None = None,
    curve: ClientKeys | None = None,
) -> int:
    """Run the TUI until the user quits: attached to ``endpoints`` (None: the local default ``coral up``),
    or replaying the journal ``replay`` at ``speed`` times its recorded time. Returns the exit status."""
    app = make_app(endpoints, replay=replay, speed=speed, store=store, catalog_files=catalog_files, curve=curve)
    app.run()
    return app.return_code or 0


async def run_tui_async(
    endpoints: Endpoints | None = None,
    *,
    replay: str | os.PathLike[str] | None = None,
    speed: float = 1.0,
    store: Path | None = None,
    catalog_files: list[Path] | None = None,
    curve: ClientKeys | None = None,
) -> int:
    """``run_tui`` inside a running asyncio event loop (for ``coral up --tui``, next to the mesh)."""
    app = make_app(endpoints, replay=replay, speed=speed, store=store, catalog_files=catalog_files, curve=curve)
    await app.run_async()
    return app.return_code or 0
