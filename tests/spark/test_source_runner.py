"""A streaming query's Python source process runs through the lake's runner (spark/source_runner.py), which ends it
without a traceback when Spark closes its socket, and leaves every other failure as it was."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from metrics_lake.spark.session import PYTHON_LAUNCHER
from metrics_lake.spark.source_runner import RUNNER

#: The runner, on a stand-in module (in the test's directory) that ends as the parameter says.
RUN = "import sys; from metrics_lake.spark.source_runner import main; sys.exit(main('standin'))"


@pytest.mark.parametrize(
    ("body", "code", "traceback"),
    [
        ("raise BrokenPipeError(32, 'Broken pipe')", 1, False),  # Spark closed the socket while it answered
        ("raise ConnectionResetError(104, 'Connection reset by peer')", 1, False),
        ("raise ValueError('a real failure')", 1, True),  # anything else is reported as before
        ("import sys; sys.exit(-1)", 255, False),  # the runner's own exit after a reported failure
        ("print('answered')", 0, False),
    ],
)
def test_the_runner_ends_quietly_only_when_spark_closed_its_socket(tmp_path, body, code, traceback):
    (tmp_path / "standin.py").write_text(f"if __name__ == '__main__':\n    {body}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", RUN], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == code
    assert ("Traceback" in done.stderr) == traceback, done.stderr


def test_the_launcher_runs_sparks_source_runner_through_the_lakes():
    """Outside Spark the runner cannot connect back to a JVM: the failure shows which module ran it."""
    env = {**os.environ, "LAKE_SPARK_PYTHON": sys.executable}
    env.pop("PYTHON_WORKER_FACTORY_PORT", None)
    done = subprocess.run([str(PYTHON_LAUNCHER), "-m", RUNNER], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "spark/source_runner.py" in done.stderr, done.stderr
    assert "python_streaming_source_runner" in done.stderr
