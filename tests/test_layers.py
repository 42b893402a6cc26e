"""Layers and the import namespace: import path = folder path, the contracts hold, nothing installed can collide."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.helpers import LAKE

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: The installed folders, bottom layer first: folder X/ is the package metrics_lake.X.
FOLDERS = ("lake_schemas", "core", "agents", "spark", "infra", "quality", "app")
COLLIDING = (*FOLDERS, "lake")


def test_import_path_is_folder_path():
    """Every mapping is metrics_lake.X -> X/, and every folder with an __init__.py under them is a listed package."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert setuptools["package-dir"] == {f"metrics_lake.{folder}": folder for folder in FOLDERS}
    on_disk = {
        "metrics_lake." + str(init.parent.relative_to(ROOT)).replace("/", ".")
        for folder in FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == on_disk
    for package in on_disk:
        module = importlib.import_module(package)
        assert Path(module.__file__).parent == ROOT / package.removeprefix("metrics_lake.").replace(".", "/")


def test_import_contracts_hold():
    """Layers import only downward; the core never imports Spark, Airflow or GX ([tool.importlinter])."""
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "0 broken" in result.stdout


def test_the_distribution_declares_one_top_level_name():
    assert importlib.metadata.distribution("metrics-lake").read_text("top_level.txt").split() == ["metrics_lake"]


def test_no_colliding_top_level_module_is_importable(tmp_path):
    """From a directory outside the checkout, none of the folder names resolves, while the namespace does."""
    script = (
        "import importlib.util as u, metrics_lake.app.cli\n"
        f"print([n for n in {COLLIDING!r} if u.find_spec(n) is not None])"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_built_wheel_holds_every_module_under_metrics_lake_only(tmp_path):
    # Build from a copy of the tracked files: setuptools writes build/ into the source tree.
    source = tmp_path / "source"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = tmp_path.glob("metrics_lake-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"metrics_lake"}
    expected = {f"metrics_lake/{name}" for name in tracked if name.split("/")[0] in FOLDERS and name.endswith(".py")}
    assert expected <= names, sorted(expected - names)
    assert {"metrics_lake/spark/log4j2.properties", "metrics_lake/lake_schemas/stored_queries.toml"} <= names


@pytest.mark.spark
@pytest.mark.integration
def test_stream_once_works_from_a_directory_with_folders_named_like_ours(tmp_path):
    """Spark's Python workers put the working directory first on sys.path; a folder named spark/ must not matter."""
    work = tmp_path / "work"
    for name in COLLIDING:
        (work / name).mkdir(parents=True)
        (work / name / "__init__.py").write_text(f"raise ImportError('imported {name}/ of the working directory')\n")
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LAKE_ROOT": str(tmp_path / "lake"),
        "LAKE_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "LAKE_SPARK_MASTER": "local[2]",
        "LAKE_SHUFFLE_PARTITIONS": "2",
    }
    for args in (["produce", "--servers", "3", "--metrics", "2", "--seconds", "20"], ["stream", "--once"]):
        result = subprocess.run([LAKE, *args], cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    bronze = DeltaTable(str(tmp_path / "lake" / "tables" / "bronze_events")).to_pyarrow_table(columns=["offset"])
    assert bronze.num_rows == 3 * 2 * 20


def test_the_architecture_page_lists_every_module_once():
    """docs/architecture.md: one line per module of the installed folders, under its folder, none missing or twice."""
    section = (ROOT / "docs" / "architecture.md").read_text()
    listing = section.split("Every module, once", 1)[1].split("```", 2)[1]
    listed, folder = [], None
    for line in listing.strip().splitlines():
        words = line.split()
        if words[0].endswith("/"):
            folder, words = words[0], words[1:]
        listed.append(f"{folder}{words[0]}")
    tracked = subprocess.run(["git", "ls-files", *FOLDERS], cwd=ROOT, capture_output=True, text=True, check=True)
    modules = [
        name
        for name in tracked.stdout.split()
        if name.endswith(".py") and not name.endswith(("__init__.py", "_pb2.py"))
    ]
    assert sorted(listed) == sorted(set(listed)), "a module is listed twice"
    assert sorted(listed) == sorted(modules)
