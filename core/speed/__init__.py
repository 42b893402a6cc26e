"""The speed layer without its engine: the micro-batch steps, the progress they record, replay.

- :mod:`.micro_batch`: plan, process chunks and commit one micro-batch into bronze, quarantine,
  the 1-minute windows and the stored query results, exactly once (Spark runs it:
  :mod:`metrics_lake.spark.jobs.stream_metrics`);
- :mod:`.open_windows`: the rows of the open-window files a stream committed last, and the
  stored queries' rows of each window file, kept in its driver so the next batch merges into
  them and evaluates its queries without reading those files back;
- :mod:`.progress`: how far the speed layer got as its tables record it (positions, watermark,
  the first day it may still rewrite, the newest window): what maintenance, quality and the
  dashboard read, so that none of them imports the micro-batch code;
- :mod:`.replay`: a log range through the bronze path again, skipping rows already present.

Nothing is imported here, so importing :mod:`.progress` loads only what it needs.
"""

__all__ = ["micro_batch", "open_windows", "progress", "replay"]
