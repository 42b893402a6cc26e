"""The application: composes the layers below into what users run. Layer 5 of 6; only ``dags/`` sits above.

- :mod:`.entry`: the ``lake`` command's entry point (the allocators chosen before any import), then :mod:`.cli`;
- :mod:`.cli`: the ``lake`` command line and its error boundary (:mod:`.cli.boundary`);
- :mod:`.demo`: ``lake demo``, the main job end to end;
- :mod:`.gateway`: ``lake gateway``, the HTTP ingest server, and the protocols it decodes;
- :mod:`.dashboard`: ``lake dashboard``, the stored queries as a web page and a JSON API;
- :mod:`.operations`: the scheduled steps that Airflow tasks call;
- :mod:`.orchestration`: what the DAGs share (Assets and outlets derived from the table registry, default arguments);
- :mod:`.console`: where output goes; :mod:`.http_server`: an ASGI app on uvicorn in a thread;
- :mod:`.speed_metrics`, :mod:`.process_metrics`: the Prometheus metrics of ``lake stream`` and of a
  long-running process's own memory.

Kept free of import-time work: ``dags/`` import :mod:`.orchestration` at parse time.
"""

__all__ = [
    "cli",
    "console",
    "dashboard",
    "demo",
    "entry",
    "gateway",
    "http_server",
    "operations",
    "orchestration",
    "process_metrics",
    "speed_metrics",
]
