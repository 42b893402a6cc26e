"""The lake's processes allocate Arrow buffers from the system allocator, unless Arrow's own variable says otherwise,
and glibc's malloc keeps the large blocks they free for reuse, unless glibc's own variables say otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from metrics_lake.core.arrow_memory import MALLOC_ENV, POOL_ENV

PROBE = (
    "import pyarrow as pa; pa.array([1, 2]); from metrics_lake.core.arrow_memory import use_system_allocator; "
    "use_system_allocator(); print(pa.default_memory_pool().backend_name, pa.array(range(10**6)).nbytes > 0)"
)


@pytest.mark.parametrize(("chosen", "expected"), [(None, "system"), ("jemalloc", "jemalloc"), ("mimalloc", "mimalloc")])
def test_the_pool_is_the_system_allocator_unless_the_user_names_one(chosen, expected):
    env = {k: v for k, v in os.environ.items() if k != POOL_ENV}
    if chosen:
        env[POOL_ENV] = chosen
    probe = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.split() == [expected, "True"]


def test_the_cli_sets_it_before_any_command_runs():
    env = {k: v for k, v in os.environ.items() if k != POOL_ENV}
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pyarrow as pa; from metrics_lake.app.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(pa.default_memory_pool().backend_name, file=sys.stderr)",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stderr.split()[-1] == "system"


#: A Parquet round trip after the lake command's start (``entry``) or after only pyarrow's Python pool was set
#: (``python``): the Python pool's name and the most mimalloc ever held (Parquet's writer allocates from Arrow's
#: C++ default pool).
CPP_POOL_PROBE = """
import io, sys
if sys.argv[1] == "entry":
    from metrics_lake.app import entry
    sys.argv = ["lake", "--help"]
    try:
        entry.main()
    except SystemExit:
        pass
else:
    from metrics_lake.core.arrow_memory import use_system_allocator
    use_system_allocator()
import pyarrow as pa, pyarrow.parquet as pq
sink = io.BytesIO()
pq.write_table(pa.table({"x": pa.array(range(10**6))}), sink)
pq.read_table(io.BytesIO(sink.getvalue()))
print(pa.default_memory_pool().backend_name, pa.mimalloc_memory_pool().max_memory())
"""


def test_the_lake_command_makes_it_arrows_cpp_default_pool_too():
    env = {k: v for k, v in os.environ.items() if k != POOL_ENV}

    def probe(start: str) -> list[str]:
        ran = subprocess.run([sys.executable, "-c", CPP_POOL_PROBE, start], env=env, capture_output=True, text=True)
        return ran.stdout.split()[-2:]

    pool, mimalloc_peak = probe("python")
    assert pool == "system" and int(mimalloc_peak) > 1_000_000  # why the variable is needed
    assert probe("entry") == ["system", "0"]


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("", "True system"),
        ("import pyarrow; ", "False mimalloc"),  # too late: Arrow read the variable at import
        ("import os; os.environ['ARROW_DEFAULT_MEMORY_POOL'] = 'jemalloc'; ", "False jemalloc"),
    ],
)
def test_the_variable_is_set_only_before_pyarrow_is_imported_and_only_if_unset(setup, expected):
    env = {k: v for k, v in os.environ.items() if k != POOL_ENV}
    code = (
        f"{setup}from metrics_lake.core.arrow_memory import default_to_system_allocator as d; first = d(); "
        "import pyarrow as pa; print(first, pa.default_memory_pool().backend_name)"
    )
    probe = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == expected


#: Where malloc puts a 64 MiB block, on the main thread and then on a new thread (below the program break: the
#: heap; else a mapping of its own), and whether a block of the same size allocated after freeing it is the same
#: memory, not pages the kernel zeroed again.
HEAP_PROBE = """
import ctypes, ctypes.util, sys, threading
from metrics_lake.core.arrow_memory import use_system_allocator
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.sbrk.restype, libc.sbrk.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t]
if sys.argv[1] == "set":
    use_system_allocator()
def probe():
    block = libc.malloc(64 << 20)
    print("heap" if block < libc.sbrk(0) else "mapped")
    ctypes.memset(block + (1 << 20), 7, 4096)
    libc.free(block)
    again = libc.malloc(64 << 20)
    print("reused" if again == block and ctypes.string_at(again + (1 << 20), 4096) == bytes([7]) * 4096 else "zeroed")
    libc.free(again)
probe()
thread = threading.Thread(target=probe)
thread.start()
thread.join()
"""


@pytest.mark.parametrize(
    ("how", "env", "expected"),
    [
        ("set", {}, ["heap", "reused"] * 2),
        ("unset", {}, ["mapped", "zeroed"] * 2),  # glibc's default: the probe sees the difference
        ("set", {"MALLOC_MMAP_MAX_": "65536"}, ["mapped", "zeroed"] * 2),  # the user's own tuning wins
        ("set", {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=65536"}, ["mapped", "zeroed"] * 2),
        ("set", {"MALLOC_ARENA_MAX": "8"}, ["mapped", "zeroed"] * 2),
    ],
)
def test_large_blocks_come_from_the_heap_and_are_reused_on_any_thread_unless_the_user_tunes_malloc(how, env, expected):
    clean = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV and k != "GLIBC_TUNABLES"}
    probe = subprocess.run(
        [sys.executable, "-c", HEAP_PROBE, how], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    assert probe.stdout.split() == expected


RELEASE = """
import psutil, pyarrow as pa
from metrics_lake.core.arrow_memory import release_freed_memory, use_system_allocator
use_system_allocator()
process = psutil.Process()
blocks = [pa.array(range(10**7 + i)) for i in range(8)]  # about 640 MB, freed next
peak = process.memory_info().rss
del blocks
kept = process.memory_info().rss
print(peak > 600 * 2**20, kept > peak - 100 * 2**20, release_freed_memory(), process.memory_info().rss < kept / 2)
"""


def test_freed_memory_is_kept_until_released():
    """What malloc keeps for reuse (the large blocks freed) stays resident until ``release_freed_memory``, which a
    stream calls after each compaction round; then the process's RSS falls back."""
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV and k != POOL_ENV}
    probe = subprocess.run([sys.executable, "-c", RELEASE], env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["True", "True", "True", "True"], probe.stdout + probe.stderr


BUDGET = """
import psutil, pyarrow as pa
from metrics_lake.core.arrow_memory import FreedMemoryBudget, memory_usage, use_system_allocator
use_system_allocator()
process = psutil.Process()
budget = FreedMemoryBudget(200 * 2**20)
first = budget.check()  # its low: the resident size now
small = [pa.array(range(10**6 + i)) for i in range(8)]  # about 64 MB, freed next: kept, below the budget
del small
kept_small = budget.check()
releases = memory_usage().releases
large = [pa.array(range(10**7 + i)) for i in range(8)]  # about 640 MB, freed next
del large
grown = process.memory_info().rss
released = budget.check()
print(first, kept_small, released, memory_usage().releases - releases, process.memory_info().rss < grown / 2,
      budget.check(), FreedMemoryBudget(0).check())
"""


def test_a_budget_gives_freed_memory_back_once_the_resident_size_grew_past_it():
    """``FreedMemoryBudget.check``: freed memory below the budget stays for reuse; once the resident size is the
    budget above its low, the memory is given back (counted in ``releases``) and the next check finds nothing to do;
    a budget of 0 releases at every check."""
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV and k != POOL_ENV}
    probe = subprocess.run([sys.executable, "-c", BUDGET], env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["False", "False", "True", "1", "True", "False", "True"], probe.stdout + probe.stderr
