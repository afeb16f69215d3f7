"""Coral's actors: the running system, on the ``coral.kernel`` mesh.

One module per actor: ``price`` (price watcher and market sources), ``demand`` (demand monitor),
``allocator``, ``supervisor`` (instance supervisor, with the clouds of ``cloud``), ``worker`` (stage
worker, owning an engine of ``coral.engines``) and ``router``. ``base`` holds the tick discipline they all
follow (which makes a run deterministic), ``feed`` the external inputs (market, traffic, faults),
``compose`` wires a run together and drives it, and ``replay`` re-runs a journal and checks its decisions.
"""
