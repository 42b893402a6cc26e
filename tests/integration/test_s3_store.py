"""The object store on a real S3 server (SeaweedFS started by the suite), and least privilege.

A session-scoped server started through `lake infra up` on free loopback
ports; each test gets its own key prefix (delta-rs's conftest pattern).
"""

from __future__ import annotations

import socket
import subprocess
import uuid

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from metrics_lake.core.storage import ObjectExistsError, VersionConflictError, content_version
from metrics_lake.infra.seaweedfs import store_as
from metrics_lake.lake_schemas.errors import AccessDeniedError
from tests.helpers import LAKE, free_port_pair

pytestmark = [pytest.mark.integration, pytest.mark.s3]


def test_up_prints_exports_for_the_pipeline_identity(s3_server):
    lines = (s3_server.data_dir / "exports.sh").read_text().splitlines()
    assert lines[0] == f"export LAKE_ROOT=s3://{s3_server.bucket}"
    assert f"export LAKE_S3_ENDPOINT={s3_server.endpoint}" in lines
    assert any(line.startswith("export LAKE_S3_ACCESS_KEY=pipeline-") for line in lines)
    assert (s3_server.config_file.stat().st_mode & 0o777) == 0o600


def test_store_primitives_behave_the_same_on_both_backends(any_store):
    any_store.create("log/t/0/a", b"first")
    with pytest.raises(ObjectExistsError):
        any_store.create("log/t/0/a", b"second")  # conditional create never overwrites
    assert any_store.read("log/t/0/a") == b"first"
    any_store.replace("log/t/0/index.json", b"{}")
    any_store.replace("log/t/0/index.json", b'{"v": 2}')
    assert any_store.read("log/t/0/index.json") == b'{"v": 2}'
    assert any_store.size("log/t/0/a") == 5
    assert any_store.list("log/t/0") == ["a", "index.json"]
    assert any_store.list("log") == ["t"] and any_store.list("nothing") == []
    assert any_store.exists("log/t/0/a") and any_store.exists("log/t") and not any_store.exists("log/t/0/b")
    with any_store.open_arrow("log/t/0/a") as source:
        assert source.read() == b"first"
    _, version = any_store.read_versioned("log/t/0/index.json")
    assert version == content_version(b'{"v": 2}')
    new_version = any_store.replace_if("log/t/0/index.json", b'{"v": 3}', version)  # compare-and-swap
    with pytest.raises(VersionConflictError):
        any_store.replace_if("log/t/0/index.json", b'{"v": 4}', version)  # stale version: refused
    with pytest.raises(VersionConflictError):
        any_store.replace_if("log/t/0/index.json", b'{"v": 4}', None)  # "only if absent": refused
    assert any_store.read_versioned("log/t/0/index.json") == (b'{"v": 3}', new_version)
    any_store.delete("log/t/0/a")
    with pytest.raises(FileNotFoundError):
        any_store.read("log/t/0/a")


def test_delta_commits_work_through_the_store_options(s3_server):
    store = store_as(s3_server, "pipeline")
    uri = store.uri(f"tables/t_{uuid.uuid4().hex}")
    data = pa.table({"x": [1, 2, 3]})
    write_deltalake(uri, data, storage_options=store.storage_options())
    write_deltalake(uri, data, mode="append", storage_options=store.storage_options())
    table = DeltaTable(uri, storage_options=store.storage_options())
    assert (table.version(), table.to_pyarrow_table().num_rows) == (1, 6)


@pytest.mark.parametrize(
    ("identity", "allowed", "refused"),
    [
        # Agents and gateways delete a fenced writer's uncommitted segment in log/, so they may delete there.
        ("agent", ["write log/", "read log/", "delete log/"], ["write tables/", "read tables/", "write quality/"]),
        (
            "pipeline",
            ["read log/", "write log/_consumers/", "write tables/", "read tables/", "write quality/"],
            ["write log/"],
        ),
        (
            "analyst",
            ["read tables/", "read quality/", "write tables/sql_audit/"],
            ["write tables/", "write quality/", "read log/", "write log/", "delete tables/"],
        ),
    ],
)
def test_each_identity_is_refused_what_it_must_not_do(s3_server, identity, allowed, refused):
    admin = store_as(s3_server, "admin")
    marker = uuid.uuid4().hex
    for prefix in ("log/", "log/_consumers/", "tables/", "quality/"):
        admin.replace(f"{prefix}{marker}", b"seed")
    store = store_as(s3_server, identity)

    def attempt(operation: str) -> None:
        verb, prefix = operation.split(" ")
        if verb == "write":
            store.replace(f"{prefix}{marker}-{identity}", b"x")
        elif verb == "delete":
            store.delete(f"{prefix}{marker}")
            assert not store.exists(f"{prefix}{marker}")
        else:
            assert store.read(f"{prefix}{marker}") == b"seed"

    for operation in allowed:
        attempt(operation)
    for operation in refused:
        with pytest.raises(AccessDeniedError) as error:
            attempt(operation)
        assert f"{marker}" in str(error.value) and "denied access (AccessDenied)" in str(error.value), operation


@pytest.mark.slow
def test_status_and_down(tmp_path):
    s3_port, master_port = free_port_pair()
    args = ["--data-dir", str(tmp_path / "sw"), "--s3-port", str(s3_port), "--master-port", str(master_port)]
    assert subprocess.run([LAKE, "infra", "status", *args], capture_output=True).returncode == 1
    try:
        assert subprocess.run([LAKE, "infra", "up", *args], capture_output=True, timeout=120).returncode == 0
        assert subprocess.run([LAKE, "infra", "status", *args], capture_output=True).returncode == 0
    finally:
        down = subprocess.run([LAKE, "infra", "down", *args], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0 and "stopped" in down.stderr
    assert subprocess.run([LAKE, "infra", "status", *args], capture_output=True).returncode == 1


def test_up_names_a_taken_port_instead_of_waiting_for_a_dying_server(tmp_path):
    s3_port, master_port = free_port_pair()
    filer_grpc = master_port - 445 + 10000
    args = ["--data-dir", str(tmp_path / "sw"), "--s3-port", str(s3_port), "--master-port", str(master_port)]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", filer_grpc))
        squatter.listen()
        up = subprocess.run([LAKE, "infra", "up", *args], capture_output=True, text=True, timeout=60)
    assert up.returncode == 2
    assert up.stderr.startswith(f"error: port {filer_grpc} (filer gRPC) on 127.0.0.1 is in use"), up.stderr
    assert "Traceback" not in up.stderr and not (tmp_path / "sw" / "weed.pid").exists()
