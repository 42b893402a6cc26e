"""``lake infra up|down|status``, ``lake infra tls``, ``lake infra spark …``, ``lake infra alertmanager …`` and ``lake airflow``: servers
this machine runs."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from metrics_lake.app.console import err
from metrics_lake.lake_schemas.errors import InputError

__all__ = ["airflow_standalone", "infra_app"]

infra_app = typer.Typer(
    help="Local servers: an S3 server (SeaweedFS: up, down, status), a Spark standalone cluster (spark ...) and "
    "Prometheus Alertmanager (alertmanager ...).",
    no_args_is_help=True,
)

DataDir = Annotated[Path, typer.Option(help="Server data, logs and identities (keep it out of git).")]
# SeaweedFS also listens on every port + 10000 (gRPC), hence the upper bounds.
S3Port = Annotated[int, typer.Option(min=1024, max=55535, help="S3 port on 127.0.0.1.")]
MasterPort = Annotated[
    int, typer.Option(min=2700, max=55535, help="SeaweedFS master port (the volume and filer ports follow it).")
]


def _s3_server(data_dir: Path, s3_port: int, master_port: int, bucket: str = "lake"):
    from metrics_lake.infra.seaweedfs import S3Server

    return S3Server(data_dir.resolve(), bucket=bucket, s3_port=s3_port, master_port=master_port)


@infra_app.command("up")
def infra_up(
    data_dir: DataDir = Path(".lake-infra/seaweedfs"),
    s3_port: S3Port = 8333,
    master_port: MasterPort = 19333,
    bucket: Annotated[str, typer.Option(help="Bucket to create.")] = "lake",
    identity: Annotated[
        str,
        typer.Option(help="Identity to export: agent, pipeline, analyst, or admin (all rights: single-user demos)."),
    ] = "pipeline",
) -> None:
    """Start SeaweedFS on 127.0.0.1 and print `export LAKE_...` lines: eval "$(lake infra up)"."""
    from metrics_lake.infra.seaweedfs import IDENTITIES, export_lines, start

    if identity not in IDENTITIES:
        raise InputError(f"--identity {identity!r}: choose one of {', '.join(IDENTITIES)}")
    server = _s3_server(data_dir, s3_port, master_port, bucket)
    start(server, log=err.print)
    for line in export_lines(server, identity):
        print(line)


@infra_app.command("tls")
def infra_tls(
    data_dir: Annotated[Path, typer.Option(help="Where the CA, certificates and keys go (keep it out of git).")] = Path(
        ".lake-infra/tls"
    ),
    host: Annotated[
        list[str] | None,
        typer.Option(
            help="A name or address the gateway and dashboard are reached by (repeat; default: localhost, "
            "127.0.0.1 and this machine's name)."
        ),
    ] = None,
) -> None:
    """Mint a local CA, a server certificate and a client certificate (for mutual TLS), and print the `export
    LAKE_TLS_...` lines that make the gateway, the dashboard, the SQL server and the agents use them: eval "$(lake
    infra tls)". The CA is also written as a Java trust store (ca-truststore.p12) for JDBC clients."""
    import socket

    from metrics_lake.infra.tls import TRUSTSTORE_PASSWORD, write_ca, write_certificate, write_java_truststore

    names = host or ["localhost", "127.0.0.1", socket.gethostname()]
    ca = write_ca(data_dir.resolve(), "metrics-lake local CA")
    cert, key = write_certificate(ca, data_dir.resolve(), "server", names)
    client_cert, client_key = write_certificate(ca, data_dir.resolve(), "client", ["lake-client"])
    truststore = write_java_truststore(ca[0], data_dir.resolve() / "ca-truststore.p12")
    err.print(
        f"CA {ca[0]}; server certificate for {', '.join(names)}; client certificate {client_cert} "
        f"(for --tls-client-ca, mutual TLS); the CA for Java clients (JDBC): {truststore}, password "
        f"{TRUSTSTORE_PASSWORD}",
        soft_wrap=True,  # paths are copied from here: never broken across lines
    )
    for name, value in (("LAKE_TLS_CERT", cert), ("LAKE_TLS_KEY", key), ("LAKE_TLS_CA", ca[0])):
        print(f"export {name}={shlex.quote(str(value))}")


@infra_app.command("down")
def infra_down(
    data_dir: DataDir = Path(".lake-infra/seaweedfs"),
    s3_port: S3Port = 8333,
    master_port: MasterPort = 19333,
    timeout: Annotated[float, typer.Option(min=0, help="Seconds to wait after SIGTERM before SIGKILL.")] = 20.0,
) -> None:
    """Stop the local S3 server (its data stays in --data-dir)."""
    from metrics_lake.infra.seaweedfs import stop

    if not stop(_s3_server(data_dir, s3_port, master_port), timeout=timeout, log=err.print):
        err.print("not running")


@infra_app.command("status")
def infra_status(
    data_dir: DataDir = Path(".lake-infra/seaweedfs"), s3_port: S3Port = 8333, master_port: MasterPort = 19333
) -> None:
    """Say whether the local S3 server runs and answers, and list its ports and who may use each; exit 1 if down."""
    from rich import table as rich_table

    from metrics_lake.infra.seaweedfs import running_pid, s3_answers

    server = _s3_server(data_dir, s3_port, master_port)
    pid = running_pid(server)
    answers = pid is not None and s3_answers(server)
    err.print(
        f"SeaweedFS {f'running (pid {pid})' if pid else 'not running'}; "
        f"S3 at {server.endpoint} {'answers' if answers else 'does not answer'}; data in {server.data_dir}"
    )
    table = rich_table.Table("port (127.0.0.1)", "listener", "who may use it")
    for port, listener, who in server.ports():
        table.add_row(str(port), listener, who)
    err.print(table)
    if not answers:
        raise typer.Exit(1)


spark_app = typer.Typer(
    help="A Spark standalone cluster on 127.0.0.1 from the installed pyspark: up, down, status.", no_args_is_help=True
)
infra_app.add_typer(spark_app, name="spark")

SparkDir = Annotated[Path, typer.Option(help="Logs, PID files and workers' work directories.")]
SparkPort = Annotated[int, typer.Option(min=1024, max=65535, help="Master port on 127.0.0.1.")]
SparkUiPort = Annotated[
    int, typer.Option(min=1024, max=65000, help="Master web UI port; worker i serves its UI on this + 1 + i.")
]


def _spark_cluster(
    data_dir: Path, master_port: int, ui_port: int, workers: int = 0, cores: int = 1, memory: str = "2g"
):
    from metrics_lake.infra.spark_cluster import SparkCluster

    return SparkCluster(data_dir.resolve(), master_port, ui_port, workers, cores, memory)


@spark_app.command("up")
def spark_up(
    data_dir: SparkDir = Path(".lake-infra/spark"),
    workers: Annotated[int, typer.Option(min=1, max=64, help="Workers to run.")] = 2,
    cores: Annotated[int, typer.Option(min=1, help="Cores each worker offers.")] = 1,
    memory: Annotated[str, typer.Option(help="Memory each worker offers to executors (e.g. 2g, 512m).")] = "2g",
    master_port: SparkPort = 7077,
    ui_port: SparkUiPort = 8080,
) -> None:
    """Start a master and --workers workers; print `export LAKE_SPARK_MASTER=...`: eval "$(lake infra spark up)".

    Start it where the lake's environment (LAKE_S3_* for an S3 lake) is exported: executors inherit it.
    """
    from metrics_lake.infra.spark_cluster import start

    if not memory[:-1].isdigit() or memory[-1:].lower() not in ("m", "g"):
        raise InputError(f"--memory {memory!r}: give megabytes or gigabytes, e.g. 512m or 2g")
    cluster = _spark_cluster(data_dir, master_port, ui_port, workers, cores, memory)
    start(cluster, log=err.print)
    print(f"export LAKE_SPARK_MASTER={cluster.url}")


@spark_app.command("down")
def spark_down(
    data_dir: SparkDir = Path(".lake-infra/spark"),
    master_port: SparkPort = 7077,
    ui_port: SparkUiPort = 8080,
    timeout: Annotated[float, typer.Option(min=0, help="Seconds to wait after SIGTERM before SIGKILL.")] = 20.0,
) -> None:
    """Stop the workers (with their executors) and the master."""
    from metrics_lake.infra.processes import bind_error
    from metrics_lake.infra.spark_cluster import stop

    if stop(_spark_cluster(data_dir, master_port, ui_port), timeout=timeout, log=err.print):
        return
    if bind_error(master_port) is not None:  # a cluster started with another --data-dir keeps its PID files there
        raise InputError(
            f"no Spark cluster's PID files in {data_dir.resolve()}, but something listens on 127.0.0.1:{master_port}: "
            "if it was started with --data-dir DIR, run `lake infra spark down --data-dir DIR`"
        )
    err.print(f"not running (no PID files in {data_dir.resolve()}, nothing on 127.0.0.1:{master_port})")


@spark_app.command("status")
def spark_status(
    data_dir: SparkDir = Path(".lake-infra/spark"), master_port: SparkPort = 7077, ui_port: SparkUiPort = 8080
) -> None:
    """Say whether the cluster runs, with its workers, cores and applications; exit 1 if the master is down."""
    from rich import table as rich_table

    from metrics_lake.infra.spark_cluster import cluster_state, running_pids

    cluster = _spark_cluster(data_dir, master_port, ui_port)
    pids, state = running_pids(cluster), cluster_state(cluster)
    master = f"running (pid {pids['master']})" if "master" in pids else "not running"
    err.print(f"Spark master {master} at {cluster.url}, web UI {cluster.ui_url}; directory {cluster.data_dir}")
    table = rich_table.Table("worker", "state", "cores (used)", "memory MiB (used)", "web UI")
    for worker in (state or {}).get("workers", []):
        table.add_row(
            worker.get("id", "?"),
            worker.get("state", "?"),
            f"{worker.get('cores', 0)} ({worker.get('coresused', 0)})",
            f"{worker.get('memory', 0)} ({worker.get('memoryused', 0)})",
            worker.get("webuiaddress", ""),
        )
    err.print(table)
    apps = [f"{a.get('name')} ({a.get('cores')} cores, {a.get('state')})" for a in (state or {}).get("activeapps", [])]
    err.print(f"applications: {', '.join(apps) or 'none'}")
    if state is None:
        raise typer.Exit(1)


alertmanager_app = typer.Typer(
    help="Prometheus Alertmanager on 127.0.0.1 (Debian's prometheus-alertmanager): up, down, status.",
    no_args_is_help=True,
)
infra_app.add_typer(alertmanager_app, name="alertmanager")

AlertmanagerDir = Annotated[Path, typer.Option(help="Alertmanager's configuration, data, log and PID file.")]
AlertmanagerPort = Annotated[int, typer.Option(min=1024, max=65535, help="API and web UI port on 127.0.0.1.")]


def _alertmanager(data_dir: Path, port: int, webhook: str | None = None):
    from metrics_lake.infra.alertmanager import LocalAlertmanager

    return LocalAlertmanager(data_dir.resolve(), port, webhook)


@alertmanager_app.command("up")
def alertmanager_up(
    data_dir: AlertmanagerDir = Path(".lake-infra/alertmanager"),
    port: AlertmanagerPort = 9093,
    webhook: Annotated[
        str | None, typer.Option(help="Also POST every notification (firing and resolved) to this URL.")
    ] = None,
) -> None:
    """Start Alertmanager and print `export LAKE_ALERTMANAGER_URL=...`: eval "$(lake infra alertmanager up)"."""
    from metrics_lake.infra.alertmanager import start

    if webhook is not None and not webhook.startswith(("http://", "https://")):
        raise InputError(f"--webhook {webhook!r}: give an http:// or https:// URL")
    manager = _alertmanager(data_dir, port, webhook)
    start(manager, log=err.print)
    print(f"export LAKE_ALERTMANAGER_URL={manager.url}")


@alertmanager_app.command("down")
def alertmanager_down(
    data_dir: AlertmanagerDir = Path(".lake-infra/alertmanager"), port: AlertmanagerPort = 9093
) -> None:
    """Stop the local Alertmanager (its data stays in --data-dir)."""
    from metrics_lake.infra.alertmanager import stop

    if not stop(_alertmanager(data_dir, port), log=err.print):
        err.print("not running")


@alertmanager_app.command("status")
def alertmanager_status(
    data_dir: AlertmanagerDir = Path(".lake-infra/alertmanager"), port: AlertmanagerPort = 9093
) -> None:
    """Say whether the local Alertmanager runs and answers, with its active alerts; exit 1 if it does not answer."""
    import requests

    from metrics_lake.infra.alertmanager import answers, running_pid

    manager = _alertmanager(data_dir, port)
    pid = running_pid(manager)
    up = answers(manager)
    err.print(
        f"Alertmanager {f'running (pid {pid})' if pid else 'not started here'}; {manager.url} "
        f"{'answers' if up else 'does not answer'}; data in {manager.data_dir}"
    )
    if not up:
        raise typer.Exit(1)
    alerts = requests.get(f"{manager.url}/api/v2/alerts", timeout=5).json()
    for alert in alerts:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(alert["labels"].items()))
        err.print(f"  {alert['status']['state']} since {alert['startsAt']}: {labels}")
    err.print(f"{len(alerts)} alert(s) in Alertmanager; web UI {manager.url}/#/alerts")


#: The DAGs folder of a source checkout (app/cli/local.py -> the repository's dags/).
CHECKOUT_DAGS = Path(__file__).resolve().parents[2] / "dags"


def airflow_standalone(
    home: Annotated[Path, typer.Option(help="AIRFLOW_HOME: config, SQLite DB, logs.")] = Path(".airflow"),
    port: Annotated[int, typer.Option(help="Port of the Airflow UI/API on 127.0.0.1.")] = 8080,
    dags_folder: Annotated[
        Path | None, typer.Option(help="Folder with the DAGs (default: dags/ of this checkout).")
    ] = None,
) -> None:
    """Start a local Airflow (standalone: scheduler, DAG processor, API server, triggerer; SQLite) with the lake's DAGs.

    The DAG tasks read LAKE_* from this environment, so they work on the
    same lake as the CLI. The UI is at http://127.0.0.1:PORT; the admin
    password is printed by Airflow and kept in HOME. Stop it with Ctrl-C.
    """
    from metrics_lake.app.cli.options import settings

    settings()  # a bad LAKE_* fails here, not in every task later
    dags = (dags_folder or CHECKOUT_DAGS).resolve()
    if not (dags / "lake_nightly.py").exists():
        raise InputError(f"no metrics-lake DAGs in {dags}; pass --dags-folder")
    beside = Path(sys.executable).with_name("airflow")  # the same virtualenv, even when it is not on PATH
    airflow = str(beside) if beside.exists() else shutil.which("airflow")
    if airflow is None:
        raise InputError("Airflow is not installed: pip install 'metrics-lake[airflow]' (python3 run.py installs it)")
    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",  # where task runners report
        # standalone starts its components as `airflow …` subprocesses: find this one first
        "PATH": f"{Path(airflow).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    err.print(
        f"Airflow home {home}, DAGs from {dags}, UI at http://127.0.0.1:{port} (Ctrl-C stops it); "
        "DAGs start paused: unpause them in the UI or with `airflow dags unpause <dag_id>`"
    )
    os.execvpe(airflow, [airflow, "standalone"], env)
