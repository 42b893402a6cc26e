"""Data quality with Great Expectations: layer 4, over the core and Spark.

- :mod:`.suites`: one expectation suite per table with a suite in the table registry;
- :mod:`.checkpoint`: :func:`~.checkpoint.run_quality`, checkpoints for a day into ``dq_results`` and data docs;
- :mod:`.freshness`: missing data is a signal: how old the newest windows and stored query results are;
- :mod:`.trend`: the pass-rate and volume trend plot.
"""

__all__ = ["checkpoint", "freshness", "suites", "trend"]
