"""Bytecode in the zips Spark's Python processes import PySpark from (metrics_lake.spark.python_bytecode)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from metrics_lake.spark import python_bytecode

MODULES = {
    "pkg/__init__.py": b"from pkg.mod import answer\n",
    "pkg/mod.py": b"def answer():\r\n    return 42\r\n\r\ndef fail():\r\n    raise ValueError('from the zip')\r\n",
    "pkg/broken.py": b"def (:\n",  # does not compile: keeps no bytecode
}
DATA = {"pkg/data.txt": b"not a module\n"}

#: Imports pkg from the zip given, recording every compile() of the zip's files (zipimport compiles with it).
IMPORT = """
import builtins, sys
compiled = []
original = builtins.compile
def recording(source, filename, *args, **kwargs):
    if str(filename).startswith(sys.argv[1]):
        compiled.append(str(filename))
    return original(source, filename, *args, **kwargs)
builtins.compile = recording
sys.path.insert(0, sys.argv[1])
import pkg, pkg.mod, traceback
try:
    pkg.mod.fail()
except ValueError as error:
    where = traceback.extract_tb(error.__traceback__)[-1]
print(pkg.answer(), pkg.mod.__file__.rsplit("/", 1)[-1], compiled, where.filename == pkg.mod.__file__[:-1], where.line)
"""


def _zip(path, entries: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


def _import(path) -> str:
    run = subprocess.run([sys.executable, "-c", IMPORT, str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_a_zip_with_bytecode_imports_its_modules_without_compiling_them(tmp_path):
    path = tmp_path / "lib.zip"
    _zip(path, MODULES | DATA)
    # Without bytecode, zipimport compiles each module twice (its spec's file name, then its code).
    assert _import(path).startswith("42 mod.py [")
    assert not python_bytecode.has_bytecode(path)

    assert python_bytecode.compile_zip(path) == 2  # pkg/broken.py does not compile
    assert python_bytecode.has_bytecode(path)
    # Loaded from the .pyc, nothing compiled; tracebacks name the source in the zip and show its line.
    assert _import(path) == "42 mod.pyc [] True raise ValueError('from the zip')"
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        assert names == set(MODULES) | set(DATA) | {"pkg/__init__.pyc", "pkg/mod.pyc"}
        assert {name: archive.read(name) for name in MODULES | DATA} == MODULES | DATA  # sources kept as they were
    assert not list(tmp_path.glob(".*.tmp"))


def test_bytecode_of_another_interpreter_is_replaced_and_a_compiled_zip_is_left_alone(tmp_path, monkeypatch):
    path = tmp_path / "lib.zip"
    _zip(path, MODULES | {"pkg/__init__.pyc": b"\x00\x00\x0d\x0a" + bytes(12)})  # another magic number
    assert not python_bytecode.has_bytecode(path)
    monkeypatch.setattr(python_bytecode, "spark_python_zips", lambda: [path])
    lines: list[str] = []
    assert python_bytecode.build(lines.append) == 2
    assert python_bytecode.has_bytecode(path)
    assert _import(path).startswith("42 mod.pyc [] ")
    written = path.stat().st_mtime_ns
    assert python_bytecode.build(lines.append) == 0  # nothing to do: the zip is not rewritten
    assert path.stat().st_mtime_ns == written
    assert lines == [f"added the bytecode of 2 modules to {path}"]


def test_a_zip_that_cannot_be_read_is_reported_and_left_as_it_is(tmp_path, monkeypatch):
    path = tmp_path / "lib.zip"
    path.write_bytes(b"not a zip")
    monkeypatch.setattr(python_bytecode, "spark_python_zips", lambda: [path])
    lines: list[str] = []
    assert python_bytecode.build(lines.append) == 0
    assert path.read_bytes() == b"not a zip"
    assert len(lines) == 1 and lines[0].startswith(f"could not add bytecode to {path}")


def test_spark_python_workers_import_pyspark_from_bytecode(spark):
    """run.py compiled the installed PySpark's zips: a task worker's PySpark modules came from their .pyc."""
    assert all(python_bytecode.has_bytecode(path) for path in python_bytecode.spark_python_zips()), (
        "run `python -m metrics_lake.spark.python_bytecode` (run.py does it when it installs)"
    )

    def loaded_from(_):
        yield sys.modules["pyspark.worker"].__file__, sys.modules["py4j"].__file__

    files = spark.sparkContext.parallelize([0], 1).mapPartitions(loaded_from).collect()
    assert all(name.endswith(".pyc") and ".zip" in name for pair in files for name in pair), files
