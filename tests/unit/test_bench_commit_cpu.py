"""bench/commit_cpu.py: its counts are whole numbers of at least 1, and a bad one is refused before anything starts
(figures are not checked: bench/ measures)."""

from __future__ import annotations

import pytest

from bench.commit_cpu import main


@pytest.mark.parametrize("flag", ["--snapshots", "--commits", "--compact-every"])
@pytest.mark.parametrize("value", ["0", "-1", "1.5", "x", "", "1e3", "9" * 400 + "x"])
def test_a_count_that_is_not_a_positive_whole_number_is_refused(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err
