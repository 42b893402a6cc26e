"""How the Delta reader and the batch jobs split a snapshot's files into Spark tasks."""

from __future__ import annotations

from metrics_lake.core.tables.snapshots import DataFile
from metrics_lake.spark.datasources.delta_reader import group_files

MIB = 1 << 20


def files(*sizes_mib: float) -> list[DataFile]:
    return [DataFile(f"f{i}", f"f{i}", int(size * MIB), (), None) for i, size in enumerate(sizes_mib)]


def sizes(groups) -> list[float]:
    return [sum(f.size for f in group) / MIB for group in groups]


def test_every_file_once_in_order_and_at_most_about_the_target():
    day = files(*[7.7] * 24)  # 185 MB: one day of the recompute benchmark
    groups = group_files(day, target_bytes=32 * MIB)
    assert [f for group in groups for f in group] == day
    assert len(groups) == 6 and all(size <= 32 for size in sizes(groups))


def test_one_task_per_core_of_about_equal_size_when_the_target_alone_gives_fewer():
    groups = group_files(files(*[7.7] * 24), target_bytes=128 * MIB, min_groups=2)
    assert [len(group) for group in groups] == [12, 12]  # not 128 MB and a 57 MB straggler
    assert len(group_files(files(*[7.7] * 24), min_groups=8)) == 8


def test_never_more_groups_than_files_and_nothing_for_no_files():
    assert len(group_files(files(300, 1, 1), target_bytes=128 * MIB, min_groups=2)) == 2
    assert len(group_files(files(5), min_groups=4)) == 1
    assert group_files([], min_groups=2) == []
