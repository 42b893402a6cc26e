"""The error boundary: every command, given bad configuration or refused by the store, prints one clear line.

Each case runs the real ``lake`` console script in a subprocess and checks
the exit code, that stderr is exactly one line starting with ``error:`` and
naming the problem, and that no traceback appears anywhere. ``lake infra``
is left out: it manages the local server and reads no ``LAKE_*`` setting.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from metrics_lake.core.log.consumer_groups import commit_offsets
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.log.producer import Producer
from metrics_lake.core.tables.delta import ensure_table
from metrics_lake.infra.seaweedfs import settings_env, store_as
from metrics_lake.lake_schemas.tables import TABLES
from tests.helpers import LAKE

DAY = "2026-11-20"
#: A run of every command that touches the lake, as short as it can be.
COMMANDS: dict[str, list[str]] = {
    "produce": ["produce", "--servers", "1", "--metrics", "1", "--seconds", "1"],
    "agent": ["agent", "--duration", "1", "--interval", "0.5"],
    "gateway": ["gateway", "--port", "0"],
    "stream": ["stream", "--once"],
    "replay": ["replay"],
    "consumers": ["consumers"],
    "recompute": ["recompute", "--date", DAY],
    "rollup": ["rollup", "--date", DAY],
    "queries": ["queries", "--date", DAY],
    "compact": ["compact"],
    "retain": ["retain"],
    "sql": ["sql", "SELECT count(*) FROM bronze_events"],
    "tables": ["tables"],
    "quality": ["quality", "--date", DAY],
    "demo": ["demo", "--seconds", "5"],
    "airflow": ["airflow", "--port", "0"],
}
#: Which identity each command is run with to be refused: one lacking what it needs.
FORBIDDEN = {
    "produce": "analyst",
    "agent": "analyst",
    "gateway": "analyst",
    "stream": "agent",
    "replay": "agent",
    "consumers": "analyst",
    "recompute": "agent",
    "rollup": "agent",
    "queries": "agent",
    "compact": "analyst",
    "retain": "analyst",
    "sql": "agent",
    "tables": "agent",
    "quality": "agent",
    "demo": "analyst",
}


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    base = {key: value for key, value in os.environ.items() if not key.startswith("LAKE_")}
    return subprocess.run([LAKE, *args], env={**base, **env}, cwd=cwd, capture_output=True, text=True, timeout=300)


def _assert_one_clear_line(result: subprocess.CompletedProcess, expected: str, what: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stdout + result.stderr, f"{what}:\n{result.stderr[-3000:]}"
    assert result.returncode == 2, f"{what}: exit {result.returncode}\n{result.stderr[-3000:]}"
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], f"{what}: {lines}"
    assert lines[-1] == errors[0], f"{what}: the error is not the last line: {lines}"


def _run_all(cases: list[tuple[str, list[str], dict[str, str], str]], cwd: Path) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda case: _run(case[1], case[2], cwd), cases))
    for (what, _, _, expected), result in zip(cases, results, strict=True):
        _assert_one_clear_line(result, expected, what)


def test_bad_configuration_fails_every_command_with_the_variable_named(tmp_path):
    cases = []
    for name, args in COMMANDS.items():
        cases.append((f"{name} with LAKE_ROOT=ftp://x", args, {"LAKE_ROOT": "ftp://x"}, "LAKE_ROOT"))
        cases.append((f"{name} with LAKE_TOPIC=../x", args, {"LAKE_TOPIC": "../x"}, "LAKE_TOPIC"))
    _run_all(cases, tmp_path)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.s3
def test_wrong_keys_and_forbidden_identities_fail_every_command_in_one_line(own_s3_server, tmp_path):
    admin = store_as(own_s3_server, "admin")
    # Seed the lake so that every command has something to read: a topic, every table, a consumer group.
    with Producer(SegmentLog(admin), "metrics", partitions=2) as producer:
        producer.send_payloads([{"ts": 1_763_600_000_000, "server": "s", "metric": "m", "value": 1.0}])
    for name in TABLES:
        ensure_table(admin, name)
    commit_offsets(admin, "speed-bronze", "metrics", {0: 0, 1: 0})

    wrong_keys = {**settings_env(own_s3_server, "admin"), "LAKE_S3_SECRET_KEY": "not-the-secret"}
    cases = [
        (f"{name} with a wrong secret key", args, wrong_keys, "rejected the credentials")
        for name, args in COMMANDS.items()
        if name != "airflow"  # it starts Airflow, which never touches the store itself
    ]
    for name, identity in FORBIDDEN.items():
        env = settings_env(own_s3_server, identity)
        cases.append((f"{name} as {identity}", COMMANDS[name], env, "denied access"))
    _run_all(cases, tmp_path)
    # The forbidden-identity line says which identity would do.
    result = _run(COMMANDS["produce"], settings_env(own_s3_server, "analyst"), tmp_path)
    assert "lake infra up --identity agent" in result.stderr


def test_debug_shows_the_traceback_and_unexpected_errors_say_they_are_bugs(tmp_path):
    folder = tmp_path / "a-directory"
    folder.mkdir()
    plain = _run(["produce", "--from-file", str(folder)], {"LAKE_ROOT": str(tmp_path / "lake")}, tmp_path)
    _assert_one_clear_line(plain, "is a directory", "produce --from-file <directory>")
    for env, args in (({"LAKE_DEBUG": "1"}, []), ({}, ["--debug"])):
        debug = _run(
            ["produce", "--from-file", str(folder), *args], {"LAKE_ROOT": str(tmp_path / "lake"), **env}, tmp_path
        )
        assert debug.returncode == 1 and "Traceback" in debug.stderr and "InputError" in debug.stderr


@pytest.fixture
def full_disk(tmp_path):
    """A 512 KiB tmpfs (needs root, as CI has); the lake root on it fills up at once."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_is_one_line_and_leaves_no_partial_segment(full_disk, tmp_path):
    root = full_disk / "lake"
    result = _run(
        ["produce", "--servers", "100", "--metrics", "10", "--seconds", "60"], {"LAKE_ROOT": str(root)}, tmp_path
    )
    _assert_one_clear_line(result, "no space left on the device holding the lake root", "produce onto a full disk")
    leftovers = [path for path in root.rglob(".tmp-*")]
    assert leftovers == []  # failed writes clean up their temporary files


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["replay", "--into", "../../x"], {}, "--into '../../x' is not a valid name"),
        (["replay", "--into", "a/x"], {}, "--into 'a/x' is not a valid name"),
        (["replay", "--into", "/tmp/escaped"], {}, "is not a valid name"),
        (["replay", "--topic", ".."], {}, "--topic '..' is not a valid name"),
        (["produce", "--seconds", "1"], {"LAKE_TOPIC": ".."}, "LAKE_TOPIC"),
        (["produce", "--seconds", "1"], {"LAKE_TOPIC": "a/x"}, "LAKE_TOPIC"),
    ],
)
def test_names_that_would_leave_the_lake_root_are_refused(tmp_path, args, env, expected):
    root = tmp_path / "deep" / "lake"
    result = _run(args, {"LAKE_ROOT": str(root), **env}, tmp_path)
    _assert_one_clear_line(result, expected, " ".join(args))
    outside = [p for p in tmp_path.rglob("*") if root not in (p, *p.parents) and p not in (root.parent,)]
    assert outside == [], f"written outside the lake root: {outside}"


def test_spark_down_says_where_it_looked_and_that_something_still_listens(tmp_path):
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        args = [LAKE, "infra", "spark", "down", "--data-dir", str(tmp_path / "elsewhere"), "--master-port", str(port)]
        busy = subprocess.run(args, capture_output=True, text=True, timeout=60, env=os.environ | {"COLUMNS": "400"})
    assert busy.returncode == 2 and "Traceback" not in busy.stderr
    assert f"no Spark cluster's PID files in {tmp_path / 'elsewhere'}" in busy.stderr
    assert f"something listens on 127.0.0.1:{port}" in busy.stderr and "--data-dir DIR" in busy.stderr
    idle = subprocess.run(args, capture_output=True, text=True, timeout=60, env=os.environ | {"COLUMNS": "400"})
    assert idle.returncode == 0 and f"not running (no PID files in {tmp_path / 'elsewhere'}" in idle.stderr
