"""The application: composes the layers below into what users run. Layer 5 of 6; only ``dags/`` sits above.

- :mod:`.cli`: the ``lake`` command line and its error boundary;
- :mod:`.demo`: ``lake demo``, the main job end to end;
- :mod:`.gateway`: ``lake gateway``, the HTTP ingest server;
- :mod:`.operations`: the scheduled steps that Airflow tasks call;
- :mod:`.orchestration`: what the DAGs share (Assets, default arguments);
- :mod:`.console`, :mod:`.errors`: output and the error vocabulary of the boundary.

Kept free of import-time work: ``dags/`` import :mod:`.orchestration` at parse time.
"""

__all__ = ["cli", "console", "demo", "errors", "gateway", "operations", "orchestration"]
