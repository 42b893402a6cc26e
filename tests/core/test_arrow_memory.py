"""The lake's processes allocate Arrow buffers from the system allocator, unless Arrow's own variable says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from metrics_lake.core.arrow_memory import POOL_ENV

PROBE = (
    "import pyarrow as pa; pa.array([1, 2]); from metrics_lake.core.arrow_memory import use_system_allocator; "
    "use_system_allocator(); print(pa.default_memory_pool().backend_name, pa.array(range(10**6)).nbytes > 0)"
)


@pytest.mark.parametrize(("chosen", "expected"), [(None, "system"), ("jemalloc", "jemalloc"), ("mimalloc", "mimalloc")])
def test_the_pool_is_the_system_allocator_unless_the_user_names_one(chosen, expected):
    env = {k: v for k, v in os.environ.items() if k != POOL_ENV}
    if chosen:
        env[POOL_ENV] = chosen
    probe = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.split() == [expected, "True"]


def test_the_cli_sets_it_before_any_command_runs():
    env = {k: v for k, v in os.environ.items() if k != POOL_ENV}
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pyarrow as pa; from metrics_lake.app.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(pa.default_memory_pool().backend_name, file=sys.stderr)",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stderr.split()[-1] == "system"
