"""One strict pattern for topic and table names; the stores refuse keys that leave the lake root."""

from __future__ import annotations

import pytest

from metrics_lake.core.keys import check_name
from metrics_lake.core.log.log import SegmentLog
from metrics_lake.core.storage import LocalStore
from metrics_lake.core.tables.delta import table_uri
from metrics_lake.lake_schemas.errors import InputError


@pytest.mark.parametrize("name", ["metrics", "bronze_copy", "a", "t" + "x" * 63])
def test_good_names_pass(name):
    assert check_name("table", name) == name


@pytest.mark.parametrize(
    "name", ["..", ".", "", "a/x", "/abs", "../../x", "Upper", "1st", "_hidden", "a-b", "a.b", "t" * 65]
)
def test_bad_names_are_refused_with_the_rule(name):
    with pytest.raises(InputError, match="not a valid name: use a lower-case letter"):
        check_name("--into", name)


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/etc/passwd", "a/./b", "..", "a/..", "a\x00b"])
def test_the_local_store_refuses_keys_that_leave_the_root(tmp_path, key):
    store = LocalStore(tmp_path / "lake")
    with pytest.raises(InputError, match="would leave the lake root"):
        store.replace(key, b"x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lake"]


def test_topics_and_tables_are_checked_where_keys_are_made(tmp_path):
    store = LocalStore(tmp_path / "lake")
    with pytest.raises(InputError):
        SegmentLog(store).ensure_topic("..", 1)
    with pytest.raises(InputError):
        table_uri(store, "../../x")
    assert list((tmp_path / "lake").iterdir()) == []
