"""One error root: every lake error is declared, drawn and exported in one module, with its exit code.

Also: library code raises no bare ``ValueError``/``RuntimeError`` (a user's
mistake must be a ``LakeError`` the command line prints as one line), except
for a caller's programming error, which says so on the ``raise`` line.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import pkgutil
import re
import subprocess
from pathlib import Path

import pytest

import metrics_lake
from metrics_lake.lake_schemas import errors
from metrics_lake.lake_schemas.contract import REASON_CODES

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("lake_schemas", "core", "agents", "spark", "infra", "quality", "app", "dags")


def all_lake_errors() -> set[type]:
    """Every LakeError subclass of every installed module (imports them all)."""
    for module in pkgutil.walk_packages(metrics_lake.__path__, "metrics_lake."):
        importlib.import_module(module.name)
    found, todo = set(), [errors.LakeError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def test_every_lake_error_is_declared_exported_and_drawn_in_the_errors_module():
    drawing = errors.__doc__.split("::", 1)[1].split("\n\n", 2)[1]
    drawn = {
        name for name in re.findall(r"([A-Z][A-Za-z]+(?:Error|Violation))\b", drawing) if not hasattr(builtins, name)
    }
    classes = all_lake_errors() | {errors.LakeError}
    assert {cls.__module__ for cls in classes} == {"metrics_lake.lake_schemas.errors"}
    names = {cls.__name__ for cls in classes}
    assert names == drawn
    assert names <= set(errors.__all__)
    assert all(hasattr(errors, name) for name in errors.__all__)


@pytest.mark.parametrize(
    ("cls", "code", "bases"),
    [
        (errors.ConfigError, 2, (ValueError,)),
        (errors.ContractViolation, 2, (errors.InputError, ValueError)),
        (errors.StorageUnavailableError, 2, (errors.StorageError, ConnectionError)),
        (errors.AccessDeniedError, 2, (PermissionError,)),
        (errors.BucketNotFoundError, 2, (errors.NotFoundError, LookupError)),
        (errors.LeaseHeldError, 75, (errors.ConflictError, RuntimeError)),
        (errors.ConcurrentWriterError, 75, (errors.ConflictError,)),
        (errors.IntegrityError, 65, (ValueError,)),
        (errors.QualityGateError, 1, (errors.CheckFailedError,)),
        (errors.InfraError, 2, (errors.ServiceError, RuntimeError)),
    ],
)
def test_exit_codes_and_standard_bases(cls, code, bases):
    assert cls.exit_code == code
    assert issubclass(cls, bases)
    assert issubclass(cls, errors.LakeError)


def test_the_drawn_exit_codes_are_the_classes_own():
    for line in errors.__doc__.splitlines():
        match = re.search(r"── (\w+).*?: (\d+)\s", line)
        if match:
            assert getattr(errors, match[1]).exit_code == int(match[2]), line


def _bare_raises(path: Path) -> list[str]:
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Raise)
            and isinstance(node.exc, ast.Call)
            and isinstance(node.exc.func, ast.Name)
            and node.exc.func.id in ("ValueError", "RuntimeError")
            and "# programming error" not in lines[node.lineno - 1]
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_no_bare_value_or_runtime_error_is_raised_for_a_users_mistake():
    tracked = subprocess.run(["git", "ls-files", *LIBRARY], cwd=ROOT, capture_output=True, text=True, check=True)
    files = [ROOT / name for name in tracked.stdout.split() if name.endswith(".py")]
    bare = [hit for path in files for hit in _bare_raises(path)]
    assert bare == [], (
        "raise a LakeError subclass (metrics_lake.lake_schemas.errors), or mark a programming error:\n"
        + ("\n".join(bare))
    )


def test_every_contract_violation_names_a_reason_code():
    """The codes given to ContractViolation, and to a protocol decoder's ``reject``, are the contract's."""
    tracked = subprocess.run(["git", "ls-files", *LIBRARY], cwd=ROOT, capture_output=True, text=True, check=True)
    codes = set()
    for name in tracked.stdout.split():
        if name.endswith(".py"):
            for node in ast.walk(ast.parse((ROOT / name).read_text())):
                if not isinstance(node, ast.Call):
                    continue
                if getattr(node.func, "id", None) == "ContractViolation":
                    code = node.args[0]
                elif getattr(node.func, "attr", None) == "reject" and len(node.args) >= 2:
                    code = node.args[1]
                else:
                    continue
                if isinstance(code, ast.Constant):
                    codes.add(code.value)
    assert len(codes) >= 10 and codes <= set(REASON_CODES), sorted(codes - set(REASON_CODES))
