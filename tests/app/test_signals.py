"""Stopping a long-running command: the first Ctrl-C or SIGTERM asks for a clean stop (and says so), a second one ends
a command that allows it at once (:func:`metrics_lake.app.cli.options.stop_on_signals`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

#: Signals itself twice, with a line to stdout after the first; ``forced`` is the argument under test.
SCRIPT = """
import os, signal, time
from metrics_lake.app.cli.options import stop_on_signals

stop = stop_on_signals(
    stopping="stopping: first signal", forced={forced!r}, before_forced_exit=lambda: os.write(2, b"hook\\n")
)
os.kill(os.getpid(), signal.{name})
print("after the first:", stop.is_set(), flush=True)
print("unflushed before the second", end="")  # os._exit drops what is not flushed: the handler flushes it
os.kill(os.getpid(), signal.{name})
time.sleep(0.2)
print("", "after the second", flush=True)
"""


def run(forced: str | None, name: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(SCRIPT.format(forced=forced, name=name))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("name", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_second_signal_ends_the_process_at_once_when_forcing_is_allowed(name, code):
    done = run("forced: second signal", name)
    assert done.returncode == code, done.stderr
    assert done.stdout == "after the first: True\nunflushed before the second"
    assert done.stderr == "stopping: first signal\nforced: second signal\nhook\n"


def test_without_forcing_a_second_signal_only_asks_again():
    done = run(None, "SIGINT")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "after the first: True\nunflushed before the second after the second\n"
    assert done.stderr == "stopping: first signal\n"
