"""The lake's Spark data sources (Python Data Source API), registered by :func:`metrics_lake.spark.session.build_session`.

- :mod:`.log_source`: format ``lakelog``, the streaming source over the segment log (how far each micro-batch reads);
- :mod:`.delta_reader`: format ``lakedelta``, a batch reader over a Delta snapshot (time travel).
"""

__all__ = ["delta_reader", "log_source"]
