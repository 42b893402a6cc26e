"""Bytecode for the PySpark modules that Spark's Python processes import from ``pyspark.zip``.

Spark starts every Python process it needs (the task workers' daemon, the
Python data sources' planners, a streaming source's runner) with
``$SPARK_HOME/python/lib/pyspark.zip`` and Py4J's zip first on their path
(``PythonUtils.sparkPythonPath``), ahead of the installed package. Those
zips hold sources only, and zipimport never writes bytecode, so each such
process compiled PySpark again, twice per module (``find_spec`` and
``exec_module`` each compile: Python 3.11's ``zipimport``). Measured here,
importing a data source planner's modules took 0.76 CPU-s from the zip as
shipped, 0.30 with this bytecode (0.25 from the installed package's), and a
Spark session starts five such processes; ``lake stream --once`` on 12 M
events took 11.1-11.9 s (median 11.2) against 11.5-12.2 s (median 11.85),
four runs each.

:func:`build` adds a ``.pyc`` beside every ``.py`` of those zips, where
zipimport looks for it first. The bytecode is hash-based and unchecked
(PEP 552): it lives in the very file that holds its source, and a new
PySpark install replaces that file whole, bytecode and all; a zip without
it, or an interpreter with another magic number, simply compiles as before.
``run.py`` calls it after installing, as pip compiles the installed
modules' bytecode itself. The zip is rewritten to a temporary file and
renamed into place, so no process ever reads half of one. A Python process
of Spark's that is running meanwhile may fail to import a module it had not
imported yet (zipimport reads the zip by path, at the offsets it listed
from the old one), so rewrite it only when no Spark runs, as ``run.py``
does right after installing.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import shutil
import sys
import zipfile
from pathlib import Path

__all__ = ["build", "compile_zip", "has_bytecode", "spark_python_zips"]

#: PEP 552 flags word: hash-based (bit 0), source not checked (bit 1 clear).
_UNCHECKED_HASH = (1).to_bytes(4, "little")


def spark_python_zips() -> list[Path]:
    """The zips Spark puts first on its Python processes' path: ``pyspark.zip`` and Py4J's, of the installed PySpark."""
    import pyspark

    return sorted((Path(pyspark.__file__).parent / "python" / "lib").glob("*.zip"))


def _bytecode_name(name: str) -> str:
    return name[: -len(".py")] + ".pyc"


def has_bytecode(path: Path) -> bool:
    """Whether the zip at ``path`` holds this interpreter's bytecode beside its first module's source."""
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
        source = next((name for name in sorted(names) if name.endswith(".py")), None)
        if source is None or _bytecode_name(source) not in names:
            return False
        return archive.read(_bytecode_name(source))[:4] == importlib.util.MAGIC_NUMBER


def _pyc(source: bytes, filename: str) -> bytes:
    """Unchecked hash-based bytecode of ``source`` (PEP 552), compiled as zipimport would (``filename`` as the
    code's file name, so tracebacks read the same)."""
    code = compile(source.replace(b"\r\n", b"\n").replace(b"\r", b"\n"), filename, "exec", dont_inherit=True)
    digest = importlib.util.source_hash(source)
    return importlib.util.MAGIC_NUMBER + _UNCHECKED_HASH + digest + marshal.dumps(code)


def compile_zip(path: Path) -> int:
    """Add this interpreter's bytecode for every module of the zip at ``path``; returns the modules compiled.

    The entries already there are kept as they are (bytecode of another
    interpreter is replaced). A source that does not compile here keeps no
    bytecode: zipimport then compiles it, and reports its error, as before.
    Raises ``OSError`` or ``zipfile.BadZipFile`` if the zip cannot be read
    or rewritten; the original then stays as it was.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    compiled = 0
    try:
        with zipfile.ZipFile(path) as source, zipfile.ZipFile(temporary, "w") as target:
            sources = {info.filename for info in source.infolist() if info.filename.endswith(".py")}
            for info in source.infolist():
                if info.filename.endswith(".pyc") and info.filename[:-1] in sources:
                    continue  # made anew below, for this interpreter
                data = source.read(info)
                target.writestr(info, data)
                if info.filename not in sources:
                    continue
                try:
                    bytecode = _pyc(data, os.path.join(str(path), info.filename))
                except (SyntaxError, ValueError):
                    continue
                entry = zipfile.ZipInfo(_bytecode_name(info.filename), date_time=info.date_time)
                entry.compress_type = info.compress_type
                target.writestr(entry, bytecode)
                compiled += 1
        shutil.copymode(path, temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return compiled


def build(log=print) -> int:
    """Compile the zips of :func:`spark_python_zips` that lack this interpreter's bytecode; returns modules compiled.

    A zip that cannot be rewritten is reported through ``log`` and left as
    it is: Spark's Python processes then compile its modules as before.
    """
    total = 0
    for path in spark_python_zips():
        try:
            if has_bytecode(path):
                continue
            compiled = compile_zip(path)
        except (OSError, zipfile.BadZipFile) as error:
            log(f"could not add bytecode to {path} (Spark's Python processes compile it instead): {error}")
            continue
        log(f"added the bytecode of {compiled:,} modules to {path}")
        total += compiled
    return total


if __name__ == "__main__":
    build(log=lambda line: print(line, file=sys.stderr))
