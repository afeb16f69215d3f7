"""Coral's terminal UI (Textual): watch and steer a live mesh through the bus, or replay a journal.

``tui.app.run_tui`` runs it; ``tui.reducer`` is the one module that knows message fields (into the view
models of ``tui.model``; ``tui.steering`` builds the commands); ``tui.bus`` is the worker that reads the
bus. The TUI imports only ``coral`` (never ``actors`` or ``solvers``, and it never creates a HiGHS object).
"""
