"""The one pattern every name that becomes part of a storage key must match: topics and tables.

A topic names ``log/<topic>/`` and a table ``tables/<name>/`` under the lake
root, so a name must never be able to leave its folder (``..``, ``a/x``, an
absolute path) or collide with a hidden or temporary object (a leading
``.`` or ``_``). :data:`NAME_PATTERN` allows a lower-case letter followed by
at most 63 lower-case letters, digits and underscores: what the design's
topics and tables use, and a valid SQL identifier without quoting.
"""

from __future__ import annotations

import re

from metrics_lake.core.errors import InputError

__all__ = ["NAME_PATTERN", "check_name"]

#: Topic and table names (also the pattern of ``LAKE_TOPIC``).
NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
_NAME = re.compile(NAME_PATTERN)


def check_name(what: str, name: str) -> str:
    """Return ``name`` if it matches :data:`NAME_PATTERN`; else raise :class:`InputError`.

    ``what`` says where the name came from in the message (``"--into"``, ``"topic"``...).
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InputError(
            f"{what} {name!r} is not a valid name: use a lower-case letter, then up to 63 lower-case letters, "
            f"digits or underscores (e.g. bronze_copy)"
        )
    return name
