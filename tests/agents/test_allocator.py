"""keep_freed_memory: a process that frees and takes large blocks again reuses them instead of faulting in new pages."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCK_MIB = 40  # an import's chunk (32 MiB) and the start of a line carried over from the one before

PROGRAM = f"""
import resource, sys, threading
from metrics_lake.agents.allocator import keep_freed_memory
if sys.argv[1] == "tuned":
    assert keep_freed_memory()

def validate_chunks():  # as the importer's validation threads do: take a block, write it whole, free it
    for _ in range(20):
        block = b"x" * ({BLOCK_MIB} << 20)
        del block

before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
worker = threading.Thread(target=validate_chunks)
worker.start()
worker.join()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def minor_faults(mode: str) -> int:
    run = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True)
    return int(run.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_freed_large_blocks_are_reused_instead_of_faulted_in_again():
    pages = (BLOCK_MIB << 20) // 4096
    default, tuned = minor_faults("default"), minor_faults("tuned")
    assert default >= 20 * pages * 0.9  # every block is fresh memory: each of its pages faults
    assert tuned <= 3 * pages  # the first block's pages fault; the next blocks reuse them
