"""The ``lake`` command's entry point: what must come before any other import, then the command line.

Arrow chooses its C++ default memory pool once, when pyarrow is imported,
from ``ARROW_DEFAULT_MEMORY_POOL``, and glibc's malloc gives a thread an
arena of its own on its first allocation unless told otherwise: both are
set here, before the command line's modules import pyarrow, delta-rs and
Spark and start their threads (:mod:`metrics_lake.core.arrow_memory`).
"""

from __future__ import annotations

from metrics_lake.core.arrow_memory import default_to_system_allocator, keep_freed_memory

__all__ = ["main"]


def main() -> None:
    """Choose the allocators (module docstring), then run ``lake`` (:func:`metrics_lake.app.cli.main`)."""
    default_to_system_allocator()
    keep_freed_memory()
    from metrics_lake.app.cli import main as run_command_line  # after the allocators: it imports pyarrow

    run_command_line()
