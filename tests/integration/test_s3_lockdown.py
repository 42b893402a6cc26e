"""`lake infra up` leaves only the signed S3 endpoint usable: every port SeaweedFS opens, probed without credentials."""

from __future__ import annotations

import http.client
import os

import grpc
import psutil
import pytest

from metrics_lake.infra.seaweedfs import running_pid, store_as

pytestmark = [pytest.mark.integration, pytest.mark.s3]

KEY = "log/metrics/0/00000000000000000000.parquet"
BODY = b"a segment the probes must neither read, change nor delete"


def http_status(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body=body)
        answer = connection.getresponse()
        return answer.status, answer.read()
    except (ConnectionError, http.client.HTTPException) as exc:
        return 0, repr(exc).encode()
    finally:
        connection.close()


def grpc_probe(target: str, credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode | None:
    """Call the filer's ListEntries on ``target``; None if it answered (an open door), else the error code."""
    options = [("grpc.ssl_target_name_override", "localhost")]
    channel = grpc.secure_channel(target, credentials, options) if credentials else grpc.insecure_channel(target)
    with channel:
        call = channel.unary_stream("/filer_pb.SeaweedFiler/ListEntries")
        try:
            list(call(b"\n\r/buckets/lake", timeout=5))
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED):
                return exc.code()
            return None  # the server read the request (it may have refused the method, but it is reachable)
        return None


def test_every_port_refuses_anonymous_clients(s3_server):
    admin = store_as(s3_server, "admin")
    admin.replace(KEY, BODY)
    pid = running_pid(s3_server)
    listening = {
        c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
    }
    documented = {port for port, _, _ in s3_server.ports()}
    assert listening == documented, f"undocumented ports: {listening - documented}"
    assert all(
        c.laddr.ip == "127.0.0.1"
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    )

    bucket = s3_server.bucket
    s3, master, filer, volume = s3_server.s3_port, s3_server.master_port, s3_server.filer_port, s3_server.volume_port
    refused = {
        "S3 list": http_status(s3, "GET", f"/{bucket}?list-type=2"),
        "S3 read": http_status(s3, "GET", f"/{bucket}/{KEY}"),
        "S3 overwrite": http_status(s3, "PUT", f"/{bucket}/{KEY}", b"x"),
        "S3 delete": http_status(s3, "DELETE", f"/{bucket}/{KEY}"),
        "filer list": http_status(filer, "GET", f"/buckets/{bucket}/log/"),
        "filer read": http_status(filer, "GET", f"/buckets/{bucket}/{KEY}"),
        "filer overwrite": http_status(filer, "PUT", f"/buckets/{bucket}/{KEY}", b"x"),
        "filer delete": http_status(filer, "DELETE", f"/buckets/{bucket}/{KEY}"),
        "master assign": http_status(master, "GET", "/dir/assign"),
        "master drop collection": http_status(master, "GET", f"/col/delete?collection={bucket}"),
        "master grow": http_status(master, "GET", "/vol/grow?count=1"),
        "master lookup": http_status(master, "GET", "/dir/lookup?volumeId=1"),
        "volume write": http_status(volume, "POST", "/1,01637037d6", b"x"),
        "volume delete": http_status(volume, "DELETE", "/1,01637037d6"),
        "volume ui": http_status(volume, "GET", "/ui/index.html"),
    }
    opened = {name: status for name, (status, _) in refused.items() if 200 <= status < 300}
    assert not opened, f"answered without credentials: {opened}"

    ca = (s3_server.data_dir / "tls" / "ca.crt").read_bytes()
    for port in (s3 + 10000, master + 10000, filer + 10000, volume + 10000):
        assert grpc_probe(f"127.0.0.1:{port}", None) is not None, f"gRPC {port} answers plaintext"
        no_client_cert = grpc.ssl_channel_credentials(root_certificates=ca)
        assert grpc_probe(f"127.0.0.1:{port}", no_client_cert) is not None, f"gRPC {port} answers without a cert"
    for sock in (
        f"/tmp/seaweedfs-{name}-grpc-{port + 10000}.sock"
        for name, port in (("master", master), ("volume", volume), ("filer", filer), ("s3", s3))
    ):
        if os.path.exists(sock):  # SeaweedFS also serves gRPC on a Unix socket; the same TLS applies
            assert grpc_probe(f"unix://{sock}", None) is not None, f"{sock} answers plaintext"

    assert admin.read(KEY) == BODY  # nothing read, changed or deleted
