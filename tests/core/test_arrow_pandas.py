"""A process that hides pandas makes Arrow arrays from numpy and Python values as before, without importing pandas,
and ``lake produce`` imports a file that way."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from metrics_lake.core.arrow_pandas import PANDAS_HIDDEN

ARRAYS = """
import json, sys
from metrics_lake.core.arrow_pandas import hide_pandas
import numpy as np, pyarrow as pa, pyarrow.compute as pc
hidden = hide_pandas()
arrays = [
    pa.array(np.arange(3)).to_pylist(),
    pa.array([1.5, None, float("nan")]).to_pylist(),
    pa.scalar("x").as_py(),
    pa.table({"a": np.array([1, 2]), "b": ["p", None]}).to_pylist(),
    pc.sum(np.arange(4)).as_py(),
]
try:
    import pandas
    refused = None
except ModuleNotFoundError as exc:
    refused = str(exc)
print(json.dumps([hidden, arrays, "pandas" in sys.modules, refused, hide_pandas()]))
"""


def _run(code: str, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, env=env
    ).stdout


def test_arrays_from_numpy_and_python_values_are_the_same_without_importing_pandas():
    hidden, arrays, imported, refused, again = json.loads(_run(ARRAYS))
    assert hidden is True and again is True  # hiding twice is harmless
    assert arrays[0] == [0, 1, 2]
    assert arrays[1][:2] == [1.5, None] and math.isnan(arrays[1][2])  # NaN stays a value, not a null
    assert arrays[2:] == ["x", [{"a": 1, "b": "p"}, {"a": 2, "b": None}], 6]
    assert imported is False
    assert refused == PANDAS_HIDDEN


def test_hiding_does_nothing_once_pandas_is_imported():
    out = _run(
        "import sys, pandas, pyarrow as pa\n"
        "from metrics_lake.core.arrow_pandas import hide_pandas\n"
        "print(hide_pandas(), pa.table({'a': [1]}).to_pandas().shape)"
    )
    assert out.split() == ["False", "(1,", "1)"]


def test_lake_produce_imports_a_file_without_importing_pandas(tmp_path):
    lines = [
        json.dumps({"ts": 1_763_596_800_000 + i, "server": f"s{i % 3}", "metric": "host.cpu.utilization", "value": i})
        for i in range(20)
    ]
    source = tmp_path / "events.jsonl"
    source.write_text("\n".join([*lines, "not json"]) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKE_")}
    env["LAKE_ROOT"] = str(tmp_path / "lakehouse")
    out = _run(
        "import sys\nfrom metrics_lake.app.cli import main\n"
        "try:\n    main(['produce', '--from-file', sys.argv[1]])\nexcept SystemExit as exc:\n    code = exc.code\n"
        "else:\n    code = 0\n"
        "print(code, 'pandas' in sys.modules)",
        str(source),
        env=env,
    )
    assert out.split() == ["0", "False"]

    from metrics_lake.core.config import load_settings
    from metrics_lake.core.log.consumer import end_offsets
    from metrics_lake.core.log.log import SegmentLog
    from metrics_lake.core.storage import open_store

    settings = load_settings(root=env["LAKE_ROOT"])
    assert sum(end_offsets(SegmentLog(open_store(settings)), settings.topic).values()) == 21  # 20 events, 1 reject
