"""`lake alerts test FILE.yaml`: the docs' test file passes, a wrong expectation fails with a diff (exit 1), and
each kind of bad file is one line naming the file, line and field (exit 2)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from metrics_lake.app.alert_tests import expand_values
from tests.app.conftest import one_line

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "alert_rules_test.yaml"


def test_expanding_notation_is_prometheus_s():
    assert expand_values("50 50 150x2 _x3 _ 1-2x4 -2+4x3 7x0 1e2") == [
        50.0,
        50.0,
        150.0,
        150.0,
        150.0,
        None,
        None,
        None,
        None,
        1.0,
        -1.0,
        -3.0,
        -5.0,
        -7.0,
        -2.0,
        2.0,
        6.0,
        10.0,
        7.0,
        100.0,
    ]
    for bad in ("150xx", "x3", "1+x2", "abc"):
        with pytest.raises(ValueError, match="is not a number"):
            expand_values(bad)


def test_the_readme_test_file_passes(lake):
    result = lake("alerts", "test", str(EXAMPLE))
    assert result.stdout.strip() == f"SUCCESS {EXAMPLE}: 5 expectation(s) held"


def test_a_wrong_expectation_prints_a_diff_and_exits_1(lake, tmp_path):
    wrong = tmp_path / "wrong.yaml"
    text = EXAMPLE.read_text()
    assert "      - eval_time: 4m\n        alertname: hot\n" in text
    wrong.write_text(
        text.replace(
            "      - eval_time: 4m\n        alertname: hot\n", "      - eval_time: 2m\n        alertname: hot\n"
        )
    )
    result = lake("alerts", "test", str(wrong), expect=1)
    assert (
        "FAILED" in result.stdout and "tests[0] (web-1 runs hot, web-2 goes quiet).alert_rule_test[2]" in result.stdout
    )
    assert "expected: {server=web-1, severity=page} firing" in result.stdout
    assert "got:      no alert" in result.stdout
    assert one_line(result) == "error: 1 of 5 alert expectation(s) failed"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "alertname: quiet",
            "alertname: nosuch",
            ":31: tests[0] (web-1 runs hot, web-2 goes quiet).alert_rule_test[3].alertname: unknown rule 'nosuch'",
        ),
        (
            'values: "10x2 _x6"',
            'values: "10x2 _y6"',
            ":16: tests[0] (web-1 runs hot, web-2 goes quiet).input_series[1].values: '_y6' is not a number",
        ),
        (
            "eval_time: 8m",
            "eval_time: 9m",
            ":34: tests[0] (web-1 runs hot, web-2 goes quiet).alert_rule_test[4]"
            ".eval_time: 9m is after the input's last value (480s)",
        ),
        ("hot: cpu_max.max > 100", "hot: cpu_min.max > 100", ":5: rules.hot: alert rule 'hot': unknown stored query"),
        ("queries:", "querys:", ":2: querys: unknown key"),
    ],
)
def test_a_bad_file_is_one_line_naming_file_line_and_field(lake, tmp_path, old, new, message):
    bad = tmp_path / "bad.yaml"
    text = EXAMPLE.read_text()
    assert old in text
    bad.write_text(text.replace(old, new, 1))
    line = one_line(lake("alerts", "test", str(bad), expect=2))
    assert line.startswith(f"error: {bad}{message}"), line


def test_a_missing_file_or_non_yaml_is_one_line(lake, tmp_path):
    assert one_line(lake("alerts", "test", str(tmp_path / "none.yaml"), expect=2)).endswith("none.yaml: no such file")
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules: [\n")
    assert "broken.yaml:2: not YAML" in one_line(lake("alerts", "test", str(broken), expect=2))


REPO = Path(__file__).resolve().parents[2]
ALERTS_PAGE = REPO / "docs" / "alerts.md"


def _docs_section() -> str:
    """docs/alerts.md from its "Absence and the day everything goes dark" section on: the Alertmanager blocks and
    the alert rule test."""
    return ALERTS_PAGE.read_text().split("## Absence and the day everything goes dark", 1)[1]


def test_the_docs_alert_test_block_and_command_run_verbatim(lake, tmp_path):
    section = _docs_section()
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    (test_file,) = [textwrap.dedent(b) for b in blocks if "input_series:" in b]
    path = tmp_path / "readme_test.yaml"
    path.write_text(test_file)
    assert lake("alerts", "test", str(path)).stdout.strip() == f"SUCCESS {path}: 1 expectation(s) held"
    (command,) = re.findall(r"```\n\s*(python3 run\.py lake alerts test [^\n]+)\n\s*```", section)
    args = shlex.split(command)[3:]  # after `python3 run.py lake`: the test's `lake` runs the same CLI
    result = lake(*args[:-1], str(REPO / args[-1]))
    assert f"SUCCESS {REPO / args[-1]}: 5 expectation(s) held" in result.stdout
    assert "prints `SUCCESS docs/alert_rules_test.yaml: 5 expectation(s) held`" in " ".join(section.split())


def test_the_docs_alertmanager_blocks_pass_amtool_check_config(tmp_path):
    amtool = shutil.which("amtool")
    assert amtool, "amtool comes with Debian's prometheus-alertmanager (.ci/run installs it)"
    blocks = [textwrap.dedent(b) for b in re.findall(r"```yaml\n(.*?)```", _docs_section(), re.DOTALL)]
    inhibit, watchdog = (b for b in blocks if "input_series:" not in b)
    config = tmp_path / "alertmanager.yml"
    config.write_text(watchdog + inhibit)
    result = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "1 inhibit rules" in result.stdout and "2 receivers" in result.stdout
