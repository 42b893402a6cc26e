#!/usr/bin/env python3
"""Run a command inside the project's virtualenv, creating and filling it first if needed.

    python3 run.py lake demo      # the main job on the embedded default
    python3 run.py pytest         # the test suite

Needs only Python 3.11 and pip (plus a Java 17 JDK for Spark: its ``javac`` compiles
the lake's Spark catalog once, spark/lake_jar.py). The virtualenv is
``.venv`` beside this file; it is (re)installed whenever pyproject.toml or
this file changes, tracked by a stamp file holding their hash.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
STAMP = VENV / ".installed-pyproject-sha256"  # of pyproject.toml and run.py: a new install step runs too


def _ensure_venv() -> None:
    if sys.version_info[:2] != (3, 11):
        sys.exit(f"run.py: Python 3.11 is required, this is {sys.version.split()[0]}")
    digest = hashlib.sha256((HERE / "pyproject.toml").read_bytes() + Path(__file__).read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == digest:
        return
    if not (BIN / "python").exists():
        print(f"run.py: creating virtualenv {VENV}", file=sys.stderr)
        venv.create(VENV, with_pip=True)
    print("run.py: installing metrics-lake and its dependencies (first run takes a few minutes)", file=sys.stderr)
    subprocess.run(
        [
            str(BIN / "python"),
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-q",
            "-e",
            f"{HERE}[dev,airflow]",
        ],
        check=True,
    )
    # The lake's JVM classes (spark/lake_jar.py): every Spark session loads them; built here once, not by a session.
    subprocess.run([str(BIN / "python"), "-m", "metrics_lake.spark.lake_jar"], check=True)
    # Spark's driver JVM starts ~40 % faster from a class-data sharing archive (spark/jvm_archive.py); optional.
    subprocess.run([str(BIN / "python"), "-m", "metrics_lake.spark.jvm_archive"], check=False)
    # Spark's Python processes import PySpark from a zip of sources: bytecode beside them (spark/python_bytecode.py).
    subprocess.run([str(BIN / "python"), "-m", "metrics_lake.spark.python_bytecode"], check=False)
    # The project's own bytecode, as pip writes it for the packages it installs: with PYTHONDONTWRITEBYTECODE set,
    # every process (Spark's Python workers too) compiled the lake's modules again, 0.1-0.2 s each (measured).
    project = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    packages = [str(HERE / folder) for folder in sorted(project.values())]
    subprocess.run([str(BIN / "python"), "-m", "compileall", "-q", *packages], check=False)
    STAMP.write_text(digest)


def main() -> None:
    """Ensure the virtualenv, then exec the given command from it."""
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    _ensure_venv()
    command = sys.argv[1:]
    executable = BIN / command[0]
    program = str(executable) if executable.exists() else command[0]
    env = dict(os.environ, VIRTUAL_ENV=str(VENV), PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    os.execvpe(program, [program, *command[1:]], env)


if __name__ == "__main__":
    main()
