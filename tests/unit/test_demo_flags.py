"""The demo's flags that do not go together are refused before anything starts."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from sink_coordinator_demo.cli import app


def test_the_change_stream_demo_and_the_fan_out_demo_are_one_at_a_time(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["--cdc", "--fan-out", "--data-dir", str(tmp_path / "demo")])
    assert result.exit_code == 2, result.output
    assert "--cdc and --fan-out are two demos: give one of them" in result.output
    assert not (tmp_path / "demo").exists()
