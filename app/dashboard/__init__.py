"""The APM dashboard: stored queries evaluated live, served as a web page and a JSON API (``lake dashboard``).

:mod:`.reader` reads the lake (delta-rs and Arrow, no Spark) and caches
closed windows; :mod:`.server` is the Starlette application on uvicorn with
the page (Plotly's bundle served from the ``plotly`` package, so it works
offline) and the API documented in docs/dashboard.md.
"""

from metrics_lake.app.dashboard.reader import DashboardReader
from metrics_lake.app.dashboard.server import build_app, serve

__all__ = ["DashboardReader", "build_app", "serve"]
