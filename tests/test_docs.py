"""The documentation: a short README, a site that builds with ``mkdocs build --strict``, reference pages that match
the code they are generated from, and every benchmark on the performance page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from metrics_lake.app import reference_docs

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_the_readme_is_a_front_door_of_at_most_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_every_relative_link_of_the_readme_names_a_file_of_the_repository():
    """GitHub renders the README outside the site, so its links are to files; mkdocs checks the site's own."""
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    relative = [link for link in links if not link.startswith(("http://", "https://"))]
    assert relative, "the README links to the documentation pages"
    assert [link for link in relative if not (ROOT / link).is_file()] == []


def test_the_generated_reference_pages_are_current():
    assert reference_docs.stale_pages(DOCS) == [], "run: python3 run.py python -m metrics_lake.app.reference_docs"


def test_a_changed_reference_page_is_reported_stale_by_the_check_command(tmp_path):
    for page, render in reference_docs.PAGES.items():
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / page).write_text(render())
    (tmp_path / "reference/tables.md").write_text("# Tables\n\nedited by hand\n")
    check = [sys.executable, "-m", "metrics_lake.app.reference_docs", "--check", "--docs", str(tmp_path)]
    result = subprocess.run(check, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "stale: docs/reference/tables.md (regenerate: python -m metrics_lake.app.reference_docs)"
    ]


def test_the_configuration_page_names_every_setting_with_a_description():
    page = (DOCS / "reference/configuration.md").read_text()
    for name, field in reference_docs.LakeSettings.model_fields.items():
        assert field.description, f"LakeSettings.{name} needs a description: the configuration page shows it"
        assert f"| `LAKE_{name.upper()}` |" in page


def test_the_cli_page_documents_every_command():
    page = (DOCS / "reference/cli.md").read_text()
    for command in ("lake stream", "lake gateway", "lake sql-server", "lake alerts test", "lake tokens create"):
        assert f"## `{command}`" in page or f"### `{command}`" in page, command


def test_the_performance_page_has_every_benchmark_command():
    page = (DOCS / "performance.md").read_text()
    benchmarks = sorted(p.name for p in (ROOT / "bench").glob("*.py") if p.name != "common.py")
    assert [name for name in benchmarks if f"python3 run.py python bench/{name}" not in page] == []


def test_the_site_builds_in_strict_mode(tmp_path):
    """No broken link or anchor, no page outside the nav, every snippet of the README found (mkdocs.yml's validation)."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    index = re.sub(r"<[^>]+>", "", (tmp_path / "site" / "index.html").read_text())  # the text, highlighting gone
    assert "python3 run.py lake demo" in index  # the Quick start, taken from the README
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
