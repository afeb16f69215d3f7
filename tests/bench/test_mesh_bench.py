"""``just bench mesh``'s arguments: bad ones are refused with one line naming the flag, before any run."""

from __future__ import annotations

import sys

import pytest

from bench import mesh as bm


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--profile-window", "1800:2400"], "--profile-window: needs --profile FILE"),
        (["--profile", "x.prof", "--profile-window", "2400:1800"], "--profile-window: expected T0 < T1"),
        (["--profile", "x.prof", "--profile-window", "peak"], "--profile-window: expected T0:T1"),
        (["--speed", "0"], "--speed: expected 'max' or a number > 0"),
        (["--solver-nice", "20"], "--solver-nice: expected an integer from 0 to 19"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["bench/mesh.py", *argv])
    with pytest.raises(SystemExit) as exc:
        bm.main()
    assert str(exc.value.code).startswith(says)


def test_a_profile_window_is_two_simulated_times() -> None:
    assert bm.profile_window("1800:2400") == (1800.0, 2400.0)
    assert bm.profile_window(None) is None
