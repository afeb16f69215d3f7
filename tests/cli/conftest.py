"""What the CLI tests share: a run of ``coral`` in this process that returns its status and output."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from coral.cli import main


@attrs.frozen
class Ran:
    """The exit status and what a ``coral`` command wrote."""

    rc: int
    out: str
    err: str


Coral = Callable[..., Ran]


@pytest.fixture
def coral(capsys: pytest.CaptureFixture[str]) -> Coral:
    """``coral(*argv)``: run the CLI in this process (argparse's exits become a status too)."""

    def run(*argv: str) -> Ran:
        capsys.readouterr()
        try:
            rc = main(list(argv))
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        cap = capsys.readouterr()
        return Ran(rc, cap.out, cap.err)

    return run
