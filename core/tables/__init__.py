"""The lake's Delta tables, through delta-rs: open and create, write data files, commit exactly once, read snapshots.

- :mod:`.delta`: where a table lives, opening, creating (from the table registry), listing, summaries;
- :mod:`.data_files`: writing Parquet data files with their Delta statistics (not yet committed);
- :mod:`.commits`: the exactly-once commit path (log positions or batch ids as ``txn`` actions);
- :mod:`.snapshots`: a snapshot's active files, read with pyarrow.
"""

__all__ = ["commits", "data_files", "delta", "snapshots"]
