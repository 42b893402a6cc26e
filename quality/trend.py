"""The trend view: pass rate and row counts per table over time, drawn from ``dq_results``.

Writes ``trend.png`` (matplotlib, two panels: share of expectations passed per
run, and rows checked per day) and ``trend.html`` (the plot plus a table of
the latest run's failures) into ``settings.quality_path``.
"""

from __future__ import annotations

import html
from pathlib import Path

import pyarrow.compute as pc

from metrics_lake.core.config import LakeSettings
from metrics_lake.core.storage import open_store
from metrics_lake.core.tables.delta import list_tables, table_dataset
from metrics_lake.lake_schemas.tables import Table


def write_trend(settings: LakeSettings) -> Path | None:
    """Draw the trend from ``dq_results``; returns the PNG path, or None if there are no results yet."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to files only
    import matplotlib.pyplot as plt

    store = open_store(settings)
    if Table.DQ_RESULTS not in list_tables(store):
        return None
    results = table_dataset(store, Table.DQ_RESULTS).to_table(
        columns=[
            "run_id",
            "run_at",
            "table",
            "success",
            "rows",
            "event_date",
            "expectation",
            "column",
            "critical",
            "observed_value",
            "sample",
        ]
    )
    if results.num_rows == 0:
        return None
    per_run = results.group_by(["run_at", "table"]).aggregate([("success", "mean")]).sort_by("run_at")
    per_day = results.group_by(["event_date", "table"]).aggregate([("rows", "max")]).sort_by("event_date")
    figure, (passes, volumes) = plt.subplots(2, 1, figsize=(10, 7), sharex=False)
    for table in sorted(set(per_run.column("table").to_pylist())):
        mine = per_run.filter(pc.equal(per_run.column("table"), table))
        passes.plot(
            mine.column("run_at").to_pylist(),
            [100 * v for v in mine.column("success_mean").to_pylist()],
            marker="o",
            label=table,
        )
        days = per_day.filter(pc.equal(per_day.column("table"), table))
        volumes.plot(
            days.column("event_date").to_pylist(), days.column("rows_max").to_pylist(), marker="o", label=table
        )
    passes.set(title="Expectations passed per run (%)", ylim=(0, 105))
    volumes.set(title="Rows checked per day", yscale="log")
    for axis in (passes, volumes):
        axis.legend(fontsize="small")
        axis.grid(alpha=0.3)
    figure.autofmt_xdate()
    figure.tight_layout()
    png = settings.quality_path / "trend.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=90)
    plt.close(figure)

    latest = results.filter(pc.equal(results.column("run_at"), pc.max(results.column("run_at"))))
    failed = latest.filter(pc.invert(latest.column("success"))).to_pylist()
    rows = (
        "".join(
            f"<tr><td>{html.escape(r['table'])}</td><td>{html.escape(r['expectation'])}</td>"
            f"<td>{html.escape(r['column'] or '')}</td><td>{'critical' if r['critical'] else 'warning'}</td>"
            f"<td>{html.escape(r['observed_value'] or '')}</td><td>{html.escape(r['sample'] or '')}</td></tr>"
            for r in failed
        )
        or "<tr><td colspan=6>every expectation passed</td></tr>"
    )
    (settings.quality_path / "trend.html").write_text(
        "<!doctype html><meta charset=utf-8><title>metrics-lake data quality</title>"
        "<h1>metrics-lake data quality</h1><p><a href='gx/uncommitted/data_docs/local_site/index.html'>GX data docs</a>"
        f' · query details: <code>lake sql "SELECT * FROM {Table.DQ_RESULTS} WHERE NOT success"</code></p>'
        "<img src='trend.png' alt='pass rate and row counts per table'>"
        "<h2>Failures in the latest run</h2><table border=1 cellpadding=4>"
        "<tr><th>table</th><th>expectation</th><th>column</th><th>severity</th><th>observed</th><th>sample</th></tr>"
        f"{rows}</table>"
    )
    return png
