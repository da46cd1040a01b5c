"""Ctrl-C and SIGTERM during a run: the first asks for a stop at the next step boundary,
the second stops at once; the handlers are the tool's only while it trains.

Real signals are sent to this process (``os.kill(os.getpid(), ...)``); Python runs the
handler in the main thread right after the call returns.  The training side (a paused
run checkpoints its step and resumes bit for bit) is in tests/test_resume.py and, through
main.py, in tests/test_bad_inputs.py.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from dclens.cli.graceful_stop import GracefulStop


def test_the_first_ctrl_c_only_asks_and_the_second_interrupts(ctrl_c_is_python_s):
    said = []
    before = signal.getsignal(signal.SIGINT)
    with GracefulStop("tool.py", notify=said.append) as stop:
        assert stop() is False
        os.kill(os.getpid(), signal.SIGINT)
        assert stop() is True and stop.signal_name == "SIGINT"
        assert len(said) == 1 and said[0].startswith("\ntool.py: SIGINT: stopping after the "
                                                     "current step, with a checkpoint")
        assert "Ctrl-C again to stop at once" in said[0]
        with pytest.raises(KeyboardInterrupt, match="SIGINT again"):
            os.kill(os.getpid(), signal.SIGINT)
        # After the second one Ctrl-C is Python's own again, inside the block too.
        assert signal.getsignal(signal.SIGINT) is before
    assert signal.getsignal(signal.SIGINT) is before


def test_sigterm_asks_too_and_the_handlers_are_restored_on_exit(ctrl_c_is_python_s):
    before = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    with GracefulStop("tool.py", notify=lambda _: None) as stop:
        assert signal.getsignal(signal.SIGTERM) == stop._handle
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop() is True and stop.signal_name == "SIGTERM"
    assert {number: signal.getsignal(number) for number in before} == before


def test_a_signal_ignored_at_the_start_stays_ignored(ctrl_c_is_python_s):
    """A background job's SIGINT (``cmd &``) is not the terminal's Ctrl-C to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with GracefulStop("tool.py", notify=lambda _: None) as stop:
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == stop._handle
        os.kill(os.getpid(), signal.SIGINT)
        assert stop() is False
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_outside_the_main_thread_it_installs_nothing_and_never_asks():
    before = signal.getsignal(signal.SIGINT)
    seen = {}

    def body() -> None:
        with GracefulStop("tool.py") as stop:
            seen["handler"] = signal.getsignal(signal.SIGINT)
            seen["asked"] = stop()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == {"handler": before, "asked": False}


def test_the_notice_reaches_a_captured_stderr(ctrl_c_is_python_s):
    """The default notice writes to file descriptor 2 where there is one, else prints."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), GracefulStop("tool.py") as stop:
        os.kill(os.getpid(), signal.SIGINT)
    assert stop() and "tool.py: SIGINT: stopping after the current step" in err.getvalue()
