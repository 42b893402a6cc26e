"""Computations on Arrow data that every engine shares: no storage, no Spark, no I/O.

The speed layer (in Spark tasks or in process), the batch layer and the
dashboard all compute with these, so their results agree:

- :mod:`.sketch`: the mergeable quantile sketch (exponential-histogram buckets, 0.54 % relative error);
- :mod:`.windows`: window states per (metric, server, window): aggregate, merge, re-window, finalize;
- :mod:`.stored_queries`: the stored query grammar, its parser, and evaluation over window states.
"""

__all__ = ["sketch", "stored_queries", "windows"]
