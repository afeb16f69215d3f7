"""The Coral terminal UI: watch and steer a live mesh, or replay a recorded journal.

The app is thin: it holds the current ``State`` (``tui.model``) in a reactive attribute, folds what the
bus worker (``tui.bus.BusWorker``) posts into it with the reducer (``tui.reducer``), which redraws the
header and the visible view, and turns the views' requests into detail pop-ups, steering forms
(``tui.steering``), previews from the allocator and control messages. It opens no file: what it shows
comes from the bus. ``run_tui`` runs it; ``make_app`` builds it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import anyio
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.reactive import var
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from coral.kernel import ClientKeys, Endpoints
from tui import model as M
from tui import reducer as R
from tui import steering as St
from tui.bus import (
    Answered,
    BusBatch,
    BusWorker,
    CommandDone,
    LinkChanged,
    LiveSource,
    ReplaySource,
    Source,
    as_envelope,
    check_speed,
    default_endpoints,
)
from tui.keys import OrderedKeysApp
from tui.screens.confirm import ConfirmScreen
from tui.screens.detail import DetailScreen, details
from tui.screens.form import CommandForm
from tui.screens.plan import PlanScreen
from tui.screens.steer import SteerMenu
from tui.steering import ACTIONS
from tui.widgets.base import StateView
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
HOTKEY_ACTIONS = STEER_ACTIONS | {"view", "quit", "replay_pause", "speed"}
"""Actions bound to printable keys: never fired while a text box has focus."""
REPLAY_ACTIONS = frozenset({"replay_pause"})
SPEED_RANGE = (1e-3, 1e6)
"""The slowest and fastest speed ``[`` and ``]`` go to (kernel seconds per wall second)."""


class CoralTui(OrderedKeysApp[int]):
    """Fleet, Models, Market, Plans and Events views under a header; steering through forms.

    ``state`` is reactive: setting it redraws the header and the visible view (``watch_state``)."""

    CSS_PATH = "app.tcss"
    TITLE = "Coral"
    BINDINGS: ClassVar[list[BindingType]] = [
        *(Binding(str(i + 1), f"view('{vid}')", label, show=False) for i, (vid, label) in enumerate(VIEWS)),
        Binding("s", "steer_menu", "Steer"),
        Binding("r", "replan", "Re-plan"),
        Binding("p", "pause", "Pause/resume"),
        *(Binding(a.key if a.key != "$" else "dollar_sign", f"steer('{a.name}')", a.title, show=False)
          for a in ACTIONS.values() if a.name not in ("replan", "pause")),
        Binding("space", "replay_pause", "Pause replay"),
        Binding("left_square_bracket", "speed(0.5)", "Slower", key_display="["),
        Binding("right_square_bracket", "speed(2.0)", "Faster", key_display="]"),
        Binding("q", "quit", "Quit"),
    ]  # fmt: skip

    state: var[M.State] = var(M.State, always_update=True)

    def __init__(
        self,
        source: Source,
        *,
        gpu_of: Mapping[str, str] | None = None,
        frame_s: float = 0.1,
        command_timeout_s: float = M.COMMAND_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        parent_fd: int | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.parent_fd = parent_fd
        """A pipe from the process that started this one: end of file on it (it stopped) quits the app."""
        self.command_timeout_s = command_timeout_s
        """A command with no answer after this long (``clock``'s seconds) is shown failed."""
        self.clock = clock
        self.bus = BusWorker(source, self.post_message, frame_s=frame_s)
        self.batches = 0
        self.blink = True
        """Whether text inputs blink their cursor (tests turn it off for stable snapshots)."""
        self._asked: set[str] = set()
        self._asked_run = 0
        self._asks = 0
        self._previews: dict[str, ConfirmScreen] = {}
        self._header: StatusHeader | None = None
        self._tabs: TabbedContent | None = None
        self._views: dict[str, StateView] = {}
        """The header, tabs and views, found once on mount (a query walks the screen: not on every batch)."""
        self.set_reactive(CoralTui.state, M.initial_state(gpu_of=gpu_of, link=M.Link("connecting", "", source.address)))

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
        base = self.screen_stack[0]
        self._header = base.query_one(StatusHeader)
        self._tabs = base.query_one("#views", TabbedContent)
        self._views = {vid: base.query_one(f"#{vid}-view", StateView) for vid, _ in VIEWS}
        self.state = self.state
        self._focus_view("fleet")
        self.run_worker(self.bus.run(), name="bus", group="bus", exit_on_error=False)
        self.set_interval(1.0, self.expire_commands)
        if self.parent_fd is not None:
            self.run_worker(self._watch_parent(self.parent_fd), name="parent", group="parent")

    async def _watch_parent(self, fd: int) -> None:
        while True:
            await anyio.wait_readable(fd)
            if not os.read(fd, 4096):
                self.exit(0)
                return

    def expire_commands(self) -> None:
        """Fail the commands that waited ``command_timeout_s`` for an answer (``M.COMMAND_TIMEOUT_S``)."""
        st = R.expire_commands(self.state, self.clock(), self.command_timeout_s)
        if st is not self.state:
            self._notify_failed(st)
            self.state = st

    def _notify_failed(self, new: M.State) -> None:
        """Pop up the commands that ``new`` fails and the current state still waits on."""
        was = {c.n for c in self.state.commands if c.status == "pending"}
        for c in new.commands:
            if c.n in was and c.status == "failed":
                self.notify(f"{c.text}: {c.reason}", title="not confirmed", severity="error")

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        if not self.blink and isinstance(event.widget, Input):
            event.widget.cursor_blink = False

    # -- drawing -----------------------------------------------------------------------------------

    @property
    def active_view(self) -> str:
        return (self._tabs.active if self._tabs is not None else "") or "fleet"

    def _view(self, vid: str) -> StateView | None:
        return self._views.get(vid)

    def watch_state(self, old: M.State, new: M.State) -> None:
        """Redraw the header and the visible view (the others when they are shown)."""
        if not self.screen_stack:
            return
        if self._header is not None:
            self._header.state = new
        view = self._view(self.active_view)
        if view is not None:
            view.state = new
        if isinstance(self.screen, CommandForm):
            self.screen.refresh_state()

    def _focus_view(self, vid: str) -> None:
        view = self._view(vid)
        if view is None:
            return
        tables = view.query(DataTable)
        if tables:
            target = tables.last() if vid == "fleet" else tables.first()
            self.screen_stack[0].set_focus(target)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        view = self._view(self.active_view)
        if view is not None:
            view.state = self.state
        self._focus_view(self.active_view)

    # -- the bus -----------------------------------------------------------------------------------

    def on_bus_batch(self, message: BusBatch) -> None:
        st = R.apply_all(self.state, message.envelopes)
        st = R.with_dropped(st, message.dropped)
        self.batches += 1
        self.state = st
        self._ask_templates(R.missing_templates(st))
        self.bus.ack()

    def _ask_templates(self, ids: list[str], deployment: str = "") -> None:
        """Ask the allocator for templates the state lacks (each id once a run)."""
        if self.state.runs != self._asked_run:
            self._asked_run = self.state.runs
            self._asked.clear()
        todo = [i for i in ids if i not in self._asked]
        if not todo and not deployment:
            return
        key = f"templates:{deployment}" if deployment else f"templates:{len(self._asked)}"
        if deployment and key in self._asked:
            return
        self._asked.update(todo)
        self._asked.add(key)
        if not self.source.read_only:
            self.bus.ask(key, St.INSPECTOR, St.templates_request(todo, deployment))

    def on_answered(self, message: Answered) -> None:
        screen = self._previews.pop(message.key, None)
        if screen is not None:
            screen.set_preview(R.preview_view(message.reply), message.error or self._unexpected(message.reply))
            return
        if message.reply is not None:
            self.state = R.apply(self.state, as_envelope(St.INSPECTOR, message.reply))

    @staticmethod
    def _unexpected(reply: Any) -> str:
        return "" if reply is None or R.preview_view(reply) is not None else f"unexpected reply {type(reply).__name__}"

    def on_link_changed(self, message: LinkChanged) -> None:
        st = R.with_link(self.state, message.link)
        self._notify_failed(st)
        self.state = st

    def on_command_done(self, message: CommandDone) -> None:
        text = St.describe_command(message.cmd)
        r = message.result
        if r is None and not any(c.n == message.n and c.status == "pending" for c in self.state.commands):
            return  # already shown failed (the link was lost, or it timed out)
        if r is None:
            self.notify(f"{text}: {message.error}", title="not sent", severity="error")
        elif r.ok:
            self.notify(f"{text}: accepted by {r.owner}", title="confirmed")
        else:
            self.notify(f"{text}: {r.field}: {r.reason}", title=f"refused by {r.owner}", severity="warning")
        self.state = R.note_result(self.state, message.n, message.cmd, message.result, message.error)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.name == "bus" and event.state == WorkerState.ERROR:
            err = event.worker.error
            self.notify(str(err), title="bus worker failed", severity="error", timeout=30)
            self.state = R.with_link(self.state, M.Link("lost", f"bus worker failed: {err}", self.source.address))

    # -- detail --------------------------------------------------------------------------------------

    def on_state_view_detail_requested(self, message: StateView.DetailRequested) -> None:
        st = self.state
        if message.kind == "plan":
            plan = st.plan(int(message.key))
            if plan is not None:
                self.push_screen(PlanScreen(st, plan))
            return
        found = details(st, message.kind, message.key)
        if found is not None:
            self.push_screen(DetailScreen(*found))

    # -- steering ----------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if isinstance(self.focused, Input) and action in HOTKEY_ACTIONS:
            return False  # a key typed into a box is text, never a hotkey
        if isinstance(self.screen, ModalScreen) and (action in STEER_ACTIONS or action == "view"):
            return False
        if action in STEER_ACTIONS:
            return not self.source.read_only
        if action in REPLAY_ACTIONS:
            return self.source.read_only
        return True

    def action_view(self, vid: str) -> None:
        if self._tabs is not None:
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
        spec = ACTIONS[name]
        if spec.confirm:
            try:
                cmd = St.build_command(self.state, name, {})
            except St.FormError as exc:
                self.notify(str(exc), title=spec.title, severity="warning")
                return
            self.confirm(name, cmd)
            return
        if spec.preview:
            deps = (
                [context.get("deployment", "")]
                if context and context.get("deployment")
                else list(self.state.deployments)
            )
            for d in deps:
                self._ask_templates([], d)

        def filled(cmd: Any) -> None:
            if cmd is None:
                return
            if spec.preview:
                self.confirm(name, cmd)
            else:
                self.send_command(name, cmd)

        self.push_screen(CommandForm(lambda: self.state, name, St.defaults(self.state, name, context)), filled)

    def confirm(self, name: str, cmd: Any) -> None:
        """Ask before sending ``cmd``; for a pin, forbid or allow, with the allocator's preview."""
        spec = ACTIONS[name]
        preview = St.preview_of(cmd)
        screen = ConfirmScreen(spec.title, f"{St.describe_command(cmd).capitalize()}?", preview=preview is not None)

        def answered(yes: bool | None) -> None:
            if yes:
                self.send_command(name, cmd)

        self.push_screen(screen, answered)
        if preview is not None:
            self._asks += 1
            key = f"preview:{self._asks}"
            self._previews[key] = screen
            self.bus.ask(key, St.INSPECTOR, preview)

    def send_command(self, action: str, cmd: Any) -> None:
        """Put a control message on the bus; its answer comes back as ``CommandDone``."""
        st, n = R.note_sent(self.state, action, cmd, at=self.clock())
        self.notify(f"{St.describe_command(cmd)}", title="sent")
        self.bus.submit(n, cmd)
        self.state = st

    def on_fleet_view_drain_requested(self, message: FleetView.DrainRequested) -> None:
        self.action_steer("drain", {"instance": message.instance})

    def on_models_view_steer_deployment(self, message: ModelsView.SteerDeployment) -> None:
        self.action_steer(message.action, {"deployment": message.deployment})

    def on_market_view_steer_entry(self, message: MarketView.SteerEntry) -> None:
        self.action_steer(message.action, {"region": message.region, "node": message.node})

    def on_plan_screen_template_action(self, message: PlanScreen.TemplateAction) -> None:
        action = message.action
        if action == "forbid" and message.template_id in self.state.forbidden:
            action = "allow"
        self.action_steer(action, {"template_id": message.template_id, "deployment": message.deployment})

    # -- replay ------------------------------------------------------------------------------------

    def action_replay_pause(self) -> None:
        if isinstance(self.source, ReplaySource):
            self.source.set_paused(not self.source.paused)
            if self.state.link.state == "replay":
                self.state = R.with_link(self.state, self.source.link_state())

    def action_speed(self, factor: float) -> None:
        """Halve or double the speed: of the replay, or of the live mesh (``SetSpeed`` to its driver)."""
        lo, hi = SPEED_RANGE
        if isinstance(self.source, ReplaySource):
            self.source.set_speed(min(hi, max(lo, self.source.speed * factor)))
            if self.state.link.state == "replay":
                self.state = R.with_link(self.state, self.source.link_state())
            return
        cmd = St.speed_command(self.state, factor, SPEED_RANGE)
        if cmd is None:
            self.notify("the mesh's speed is not known (not paced, or not said yet)", severity="warning")
            return
        self.send_command("speed", cmd)


def make_app(
    endpoints: Endpoints | None = None,
    *,
    replay: str | os.PathLike[str] | None = None,
    speed: float = 1.0,
    store: Path | None = None,
    catalog_files: list[Path] | None = None,
    source: Source | None = None,
    curve: ClientKeys | None = None,
    parent_fd: int | None = None,
) -> CoralTui:
    """The app for a live mesh (``endpoints``, or the local default), a journal (``replay``) or a source.

    ``store`` and ``catalog_files`` are not read: templates, deployments and GPU types come from the mesh
    (the inspection requests of ``tui.steering``) or, in a replay, from the journal's run setup."""
    del store, catalog_files
    if source is None:
        if replay is not None:
            source = ReplaySource(replay, speed=check_speed(speed))
        else:
            source = LiveSource(endpoints if endpoints is not None else default_endpoints(), curve=curve)
    return CoralTui(source, parent_fd=parent_fd)


def run_tui(
    endpoints: Endpoints | None = None,
    *,
    replay: str | os.PathLike[str] | None = None,
    speed: float = 1.0,
    store: Path | None = None,
    catalog_files: list[Path] | None = None,
    curve: ClientKeys | None = None,
    parent_fd: int | None = None,
) -> int:
    """Run the TUI until the user quits: attached to ``endpoints`` (None: the local default ``coral up``),
    or replaying the journal ``replay`` at ``speed`` times its recorded time. Returns the exit status.
    ``parent_fd``: quit at end of file on it (``coral up --tui``'s pipe: the mesh stopped)."""
    app = make_app(
        endpoints,
        replay=replay,
        speed=speed,
        store=store,
        catalog_files=catalog_files,
        curve=curve,
        parent_fd=parent_fd,
    )
    app.run()
    return app.return_code or 0
