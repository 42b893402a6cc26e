"""A class-data sharing archive of the Spark driver's classes: the JVM starts without reading 400 MB of jars.

Java's dynamic CDS archives (JEP 350, Java 13+) keep the classes a run
loaded, pre-parsed, in one file the next JVM maps at start. Measured here
(2 cores, Spark 4.2, Java 17): a local SparkSession starts in 3.2 s instead
of 5.0 s and its first job runs in 1.0 s instead of 1.9 s; more when the
page cache is cold. Every ``lake`` command that starts Spark, and every
Spark test, gains that.

The archive lives in the virtualenv (``<prefix>/share/metrics-lake/``) and
is named after what it depends on: the ``java`` executable and the Spark
jars (a different Java or Spark version simply finds no archive). It is made
by ``python -m metrics_lake.spark.jvm_archive`` (``run.py`` does it after
installing): one representative run (a stream batch, a Delta read, SQL)
with ``-XX:ArchiveClassesAtExit`` writes it to a temporary file when its JVM
exits, which is then renamed into place, so a half-written archive (which
crashes a JVM that maps it, measured: SIGBUS) is never used. Without an
archive Spark starts as usual.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["archive_path", "build", "java_options"]


def _key() -> str | None:
    """Hash of the java executable (path, size, mtime) and the Spark jars' names; None without java."""
    java = shutil.which(
        "java", path=os.path.join(os.environ["JAVA_HOME"], "bin") if os.environ.get("JAVA_HOME") else None
    )
    if java is None:
        return None
    import pyspark

    real = Path(java).resolve()
    stat = real.stat()
    jars = sorted(p.name for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar"))
    material = "\n".join([str(real), str(stat.st_size), str(stat.st_mtime_ns), pyspark.__version__, *jars])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def archive_path() -> Path | None:
    """Where this environment's archive is (whether or not it exists); None without java."""
    key = _key()
    if key is None:
        return None
    return Path(sys.prefix) / "share" / "metrics-lake" / f"spark-driver-{key}.jsa"


def java_options() -> str:
    """Driver JVM options that map the archive, or ``""`` if there is none for this Java and Spark."""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def _representative_run(archive: Path) -> None:
    """Start Spark with ``-XX:ArchiveClassesAtExit``, use what the lake's commands use, and wait for the JVM to exit."""
    from pyspark import SparkContext

    from metrics_lake.core.config import load_settings
    from metrics_lake.core.log.producer import producer_for
    from metrics_lake.lake_schemas.tables import Table
    from metrics_lake.spark.jobs.sql_query import run_sql
    from metrics_lake.spark.jobs.stream_metrics import run_stream
    from metrics_lake.spark.session import build_session

    with tempfile.TemporaryDirectory(prefix="lake-cds-") as work:
        settings = load_settings(root=f"{work}/lake", checkpoint_dir=f"{work}/ck", spark_master="local[2]")
        with producer_for(settings) as producer:  # a minute of a small fleet, made up here
            now_ms = int(time.time() * 1000)
            producer.send_payloads(
                [
                    {"ts": now_ms - i * 1000, "server": f"s{i % 3}", "metric": "cpu.util", "value": float(i)}
                    for i in range(60)
                ]
            )
        spark = build_session(settings, "lake-jvm-archive", extra_java_options=f"-XX:ArchiveClassesAtExit={archive}")
        run_stream(spark, settings, once=True)
        run_sql(spark, settings, f"SELECT metric, count(*) FROM {Table.METRIC_WINDOWS_1M} GROUP BY metric").collect()
        spark.stop()
        gateway = SparkContext._gateway
        gateway.shutdown()
        gateway.proc.stdin.close()  # the driver JVM exits when its stdin closes, writing the archive
        gateway.proc.wait(timeout=300)


def build(log=print) -> Path | None:
    """Make this environment's archive (about 30 s) unless it exists; returns its path, None if impossible.

    Failures are reported through ``log`` and leave no archive: Spark then
    starts without one.
    """
    path = archive_path()
    if path is None:
        log("no java found: skipping the Spark class-data sharing archive")
        return None
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    log(f"making the Spark class-data sharing archive {path} (once, about 30 s) ...")
    result = subprocess.run(
        [sys.executable, "-m", "metrics_lake.spark.jvm_archive", "--dump", str(temporary)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0 or not temporary.is_file() or temporary.stat().st_size == 0:
        temporary.unlink(missing_ok=True)
        log(f"could not make the archive (Spark starts without it): {result.stderr.strip().splitlines()[-1:]}")
        return None
    os.replace(temporary, path)
    return path


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--dump":
        _representative_run(Path(sys.argv[2]))
    else:
        made = build()
        print(made if made else "no archive made")
