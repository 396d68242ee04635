"""SIGINT and SIGTERM only record a stop request (spark_writer.stop_signals); a second one ends the process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from spark_writer.stop_signals import stop_on_signals


def test_a_signal_records_the_request_and_raises_nothing() -> None:
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with stop_on_signals() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signal is signal.SIGTERM
        assert stop.exit_code == 143
        # From now on both signals have their default action: a second one ends the process.
        assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_install_takes_the_handlers_back() -> None:
    """A SparkContext puts in a SIGINT handler that raises KeyboardInterrupt; install() replaces it again."""
    with stop_on_signals() as stop:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stop.install()
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signal is signal.SIGINT
        assert stop.exit_code == 130


def test_a_second_signal_ends_the_process() -> None:
    script = """
    import os, signal, time
    from spark_writer.stop_signals import stop_on_signals
    with stop_on_signals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
    """
    finished = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], timeout=60, check=False)
    assert finished.returncode == -signal.SIGTERM
