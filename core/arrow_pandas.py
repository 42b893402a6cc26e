"""pyarrow without pandas, for a process that never hands pandas objects to Arrow: 0.2 s less at its start.

pandas is an optional dependency of pyarrow, which imports it when a
process first makes an Arrow array: from numpy its pandas shim asks whether
the array is a pandas Series (``_PandasAPIShim`` in pyarrow's
``pandas-shim.pxi``), from Python values its C++ converter looks for
pandas' missing-value markers (``InitPandasStaticData``). Importing pandas
2.3 takes 0.2 s of wall time and 0.23-0.26 s of CPU here (``python -c
"import numpy, pyarrow as pa; pa.array(numpy.arange(3))"``, timing the
``pa.array``). ``lake produce --from-file`` made its first Arrow array in
its first chunk's validation: the import spent those 0.2 s before its first
append, while a running stream that consumes the log had nothing to do.

:func:`hide_pandas` puts a finder on ``sys.meta_path`` that refuses to
import pandas, so pyarrow works in this process as on a machine without
pandas. That changes nothing for Arrow data that never was pandas: only
what pyarrow makes of a pandas object (a Series given to ``pa.array`` is read
as a plain sequence) and whether ``Table.to_pandas`` works (it raises
``ModuleNotFoundError``). Hence only commands that never touch pandas call
it, first thing. Measured: ``lake produce --from-file`` of one line 0.66-0.72 s
before, 0.52-0.53 s after (``/usr/bin/time``, three runs each).
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder

__all__ = ["PANDAS_HIDDEN", "hide_pandas"]

#: The message of the ``ModuleNotFoundError`` that importing pandas raises once :func:`hide_pandas` ran.
PANDAS_HIDDEN = "pandas is hidden in this process (metrics_lake.core.arrow_pandas.hide_pandas)"


class _RefusePandas(MetaPathFinder):
    """A ``sys.meta_path`` finder that makes ``import pandas`` raise ``ModuleNotFoundError``."""

    def find_spec(self, name: str, path=None, target=None):
        """Raise ``ModuleNotFoundError`` for ``pandas`` and its submodules; ``None`` (not mine) for any other."""
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(PANDAS_HIDDEN, name=name)
        return None


def hide_pandas() -> bool:
    """Make ``import pandas`` fail for the rest of this process (module docstring); returns whether it did.

    Does nothing, and returns False, if pandas is imported already: the
    cost is paid, and code may hold it.
    """
    if "pandas" in sys.modules:
        return False
    if not any(isinstance(finder, _RefusePandas) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RefusePandas())
    return True
