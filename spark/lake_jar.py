"""The lake's JVM classes (``spark/jvm/``), compiled into a jar the Spark driver loads.

Spark's own Parquet scan reads the lake's tables (:mod:`metrics_lake.spark.catalog`): a
catalog extension (``metricslake.spark.LakeCatalog``) gives Spark each table's Delta
snapshot as a file index, which only JVM code can do. The sources are compiled
with the JDK's ``javac`` against the installed pyspark's jars (no build tool,
nothing downloaded) into ``<prefix>/share/metrics-lake/lake-spark-<key>.jar``,
keyed by the sources and the Spark jars, so a changed source or Spark version
builds a new jar. ``run.py`` builds it after installing; a session that finds
none builds it then (about 3 s).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from metrics_lake.lake_schemas.errors import LakeError

__all__ = ["SOURCES", "build", "jar_path"]

#: The Java sources, package ``metricslake.spark``.
SOURCES = Path(__file__).with_name("jvm")


def _spark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.java"))


def jar_path() -> Path:
    """Where this environment's jar is (whether or not it was built yet)."""
    digest = hashlib.sha256()
    for source in _sources():
        digest.update(source.relative_to(SOURCES).as_posix().encode() + b"\0" + source.read_bytes())
    digest.update("\n".join(sorted(p.name for p in _spark_jars().glob("*.jar"))).encode())
    return Path(sys.prefix) / "share" / "metrics-lake" / f"lake-spark-{digest.hexdigest()[:16]}.jar"


def _javac() -> str:
    home = os.environ.get("JAVA_HOME")
    javac = shutil.which("javac", path=os.path.join(home, "bin") if home else None) or shutil.which("javac")
    if javac is None:
        raise LakeError(
            "javac not found: the lake's Spark tables need a JDK to compile their JVM classes once "
            "(Debian: apt-get install openjdk-17-jdk-headless; or set JAVA_HOME to a JDK)"
        )
    return javac


def build() -> Path:
    """The jar, compiled now if missing; raises :class:`~metrics_lake.lake_schemas.errors.LakeError` if impossible.

    Compiles into a temporary folder and renames the finished jar into
    place, so a concurrent build or an interrupted one never leaves a
    partial jar to load.
    """
    path = jar_path()
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lake-jar-") as work:
        classes = Path(work) / "classes"
        result = subprocess.run(
            [
                _javac(),
                "-nowarn",
                "--release",
                "17",
                "-d",
                str(classes),
                "-cp",
                str(_spark_jars() / "*"),
                *map(str, _sources()),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise LakeError(f"compiling the lake's JVM classes failed: {result.stderr.strip()[:2000]}")
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as jar:
            for compiled in sorted(classes.rglob("*.class")):
                jar.write(compiled, compiled.relative_to(classes).as_posix())
        os.replace(temporary, path)
    return path


if __name__ == "__main__":
    print(build())
