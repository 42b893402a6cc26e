"""The registry: the stored queries operators manage at run time, as versioned lake state under ``LAKE_ROOT``.

Every edit writes one new immutable object, ``registry/versions/<n>.json``
(:func:`metrics_lake.core.keys.registry_version_key`), holding the whole
registry after the edit and the edit itself (what changed, who, when). The
newest version is the registry; the older ones are its history. An edit is
made against the version it read and written with a create-if-absent of the
next version number (``If-None-Match: *`` on S3, ``O_EXCL``-style on a local
folder), so of two operators editing at once exactly one wins and the other
gets :class:`~metrics_lake.lake_schemas.errors.RegistryConflictError` (exit
75: nothing of the loser's edit was applied; read again and retry). The same
compare-and-create is how Mimir's ruler store and Delta's own log order
their writers.

A lake that has no version yet reads the declarations shipped with the
package (``lake_schemas/stored_queries.toml``) as version 0; the first
writer (``lake stream`` on start, or any edit) stores them as version 1, so
later package upgrades never change an existing lake's queries.

Each entry keeps a **revision**: the version at which its query text last
changed (a new description alone does not change it). Readers use it to know
whether what a table holds for a query is of its current definition: the
speed layer adopts a new revision on its next micro-batch, the backfill
(:mod:`metrics_lake.core.maintenance.query_backfill`) recomputes the closed
windows (both record the revision they applied in ``query_results``).

Version object (JSON, UTF-8)::

    {"version": 7, "at": "2026-11-23T10:00:00+00:00", "by": "alice",
     "changes": [{"action": "put", "name": "...", "query": "FROM ...", "description": "..."}],
     "queries": {"<name>": {"query": "FROM ...", "description": "...", "revision": 7,
                            "changed_at": "...", "changed_by": "alice"}}}
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from metrics_lake.core import keys
from metrics_lake.core.kernels.stored_queries import DEFAULT_FILE, StoredQuery, load_stored_queries, parse_query
from metrics_lake.core.storage import ObjectExistsError, Store
from metrics_lake.lake_schemas.errors import IntegrityError, NotFoundError, RegistryConflictError, StoredQueryError

__all__ = [
    "Change",
    "Entry",
    "Registry",
    "RegistryVersion",
    "declared_changes",
    "default_author",
    "read_declarations",
]

#: The format of a version object; a reader refuses others rather than misread them.
FORMAT = 1


@dataclass(frozen=True)
class Entry:
    """One stored query as the registry holds it.

    ``revision``: the registry version at which ``query`` (the text) last
    changed; ``changed_at`` (ISO 8601, UTC) and ``changed_by``: the last edit
    of any kind (text or description).
    """

    name: str
    query: str
    description: str
    revision: int
    changed_at: str
    changed_by: str

    def parsed(self) -> StoredQuery:
        """The entry as a :class:`StoredQuery` carrying its revision."""
        return replace(parse_query(self.name, self.query, self.description), revision=self.revision)


@dataclass(frozen=True)
class Change:
    """One edit: ``put`` a query (new or changed) or ``delete`` one; ``query``/``description`` for ``put`` only."""

    action: str
    name: str
    query: str | None = None
    description: str | None = None

    def describe(self) -> str:
        """One line for a dry run or a history listing: ``+ name: FROM …`` / ``- name``."""
        return f"- {self.name}" if self.action == "delete" else f"+ {self.name}: {self.query}"


@dataclass(frozen=True)
class RegistryVersion:
    """The registry as of one version: its entries by name and the edit that made it (``version`` 0: the seed)."""

    version: int
    at: str
    by: str
    changes: tuple[Change, ...]
    entries: dict[str, Entry] = field(default_factory=dict)

    def queries(self) -> list[StoredQuery]:
        """Every stored query, parsed, sorted by name."""
        return [self.entries[name].parsed() for name in sorted(self.entries)]

    def entry(self, name: str) -> Entry:
        """The entry ``name``; :class:`NotFoundError` naming the known ones if there is none."""
        if name not in self.entries:
            known = ", ".join(sorted(self.entries)) or "none"
            raise NotFoundError(f"no stored query {name!r} (registry version {self.version}; known: {known})")
        return self.entries[name]

    def to_json(self) -> bytes:
        """The version object (module docstring)."""
        doc = {
            "format": FORMAT,
            "version": self.version,
            "at": self.at,
            "by": self.by,
            "changes": [{k: v for k, v in vars(c).items() if v is not None} for c in self.changes],
            "queries": {
                name: {k: v for k, v in vars(e).items() if k != "name"} for name, e in sorted(self.entries.items())
            },
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, key: str) -> RegistryVersion:
        """Parse a version object; :class:`IntegrityError` naming ``key`` if it is not one this lake wrote."""
        try:
            doc = json.loads(data)
            if doc.get("format") != FORMAT:
                raise IntegrityError(f"registry object {key} has format {doc.get('format')!r}, not {FORMAT}")
            entries = {name: Entry(name=name, **fields) for name, fields in doc["queries"].items()}
            changes = tuple(Change(**c) for c in doc["changes"])
            return cls(int(doc["version"]), doc["at"], doc["by"], changes, entries)
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"registry object {key} is not a registry version ({exc}); restore it") from None


def default_author() -> str:
    """Who an edit is recorded as when the caller does not say: ``LAKE_AUTHOR``, else the OS user."""
    try:
        return os.environ.get("LAKE_AUTHOR") or getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return f"uid-{os.getuid()}"


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def read_declarations(path: str | Path) -> dict[str, tuple[str, str]]:
    """``{name: (query, description)}`` of a stored-queries TOML file (``[[queries]]`` tables).

    Every query is parsed, so a bad one fails here, naming it and the clause
    (:class:`StoredQueryError`), before anything is applied.
    """
    return {q.name: (q.text, q.description) for q in load_stored_queries(path)}


def declared_changes(current: RegistryVersion, declared: dict[str, tuple[str, str]]) -> list[Change]:
    """The edits that make ``current`` hold exactly ``declared`` (``{name: (query, description)}``), by name."""
    changes = [
        Change("put", name, query, description)
        for name, (query, description) in sorted(declared.items())
        if name not in current.entries
        or (current.entries[name].query, current.entries[name].description) != (query, description)
    ]
    changes += [Change("delete", name) for name in sorted(set(current.entries) - set(declared))]
    return changes


class Registry:
    """The registry of one lake (module docstring): read its current version, apply edits, list its history.

    ``seed``: the declarations a lake without a registry starts from
    (default: the shipped ``stored_queries.toml``). Reads are cached by
    version, so polling it every micro-batch costs one LIST.
    """

    def __init__(self, store: Store, seed: str | Path | None = None) -> None:
        self.store = store
        self.seed_file = Path(seed or DEFAULT_FILE)
        self._cache: dict[int, RegistryVersion] = {}

    def versions(self) -> list[int]:
        """Every stored version number, ascending (empty for a lake that has none yet)."""
        return [int(name.removesuffix(".json")) for name in self.store.list(keys.REGISTRY_VERSIONS_PREFIX)]

    def read(self, version: int) -> RegistryVersion:
        """Version ``version`` (0: the seed); :class:`NotFoundError` if it does not exist."""
        if version == 0:
            return self._seed_version()
        if version not in self._cache:
            key = keys.registry_version_key(version)
            try:
                data = self.store.read(key)
            except FileNotFoundError:
                raise NotFoundError(f"no registry version {version}: see `lake queries history`") from None
            self._cache[version] = RegistryVersion.from_json(data, key)
        return self._cache[version]

    def current(self) -> RegistryVersion:
        """The newest version, or the seed (version 0) if nothing was stored yet."""
        versions = self.versions()
        return self.read(versions[-1]) if versions else self._seed_version()

    def history(self, name: str | None = None) -> list[RegistryVersion]:
        """Every stored version, oldest first; with ``name``, only those whose edit touched that query."""
        versions = [self.read(v) for v in self.versions()]
        if name is not None:
            versions = [v for v in versions if any(c.name == name for c in v.changes)]
        return versions

    def ensure_seeded(self) -> RegistryVersion:
        """Store the seed as version 1 if the lake has no registry yet; the current version either way."""
        if not self.versions():
            seed = self._seed_version()
            try:
                at = _now()
                entries = {name: replace(e, revision=1, changed_at=at) for name, e in seed.entries.items()}
                self._write(replace(seed, version=1, at=at, entries=entries))
            except ObjectExistsError:
                pass  # another process seeded it first: the same declarations or an edit on top of them
        return self.current()

    def apply(self, changes: list[Change], *, by: str | None = None, expected: int | None = None) -> RegistryVersion:
        """Apply ``changes`` as one new version; returns it (or the current one if they change nothing).

        ``expected``: the version the caller's edit was made against (e.g. an
        HTTP ``If-Match``); default the version read here. Raises
        :class:`StoredQueryError` for a bad query or a duplicate name in
        ``changes``, :class:`NotFoundError` for deleting an unknown query
        (nothing is applied then), :class:`RegistryConflictError` if the
        registry moved past ``expected`` or another edit won the race.
        """
        base = self.current()
        if expected is not None and expected != base.version:
            raise self._conflict(base.version, expected)
        names = [c.name for c in changes]
        if len(set(names)) != len(names):
            raise StoredQueryError(
                f"an edit names a stored query twice: {sorted({n for n in names if names.count(n) > 1})}"
            )
        by, at = by or default_author(), _now()
        version = base.version + 1
        entries = dict(base.entries)
        effective = []
        for change in changes:
            if change.action == "delete":
                base.entry(change.name)  # NotFoundError names the known ones
                del entries[change.name]
                effective.append(change)
                continue
            if change.action != "put" or change.query is None:
                raise ValueError(f"not a registry change: {change}")  # programming error
            parsed = parse_query(change.name, change.query, change.description or "")  # StoredQueryError
            old = entries.get(change.name)
            description = change.description if change.description is not None else (old.description if old else "")
            if old is not None and (old.query, old.description) == (parsed.text, description):
                continue
            revision = old.revision if old is not None and old.query == parsed.text else version
            entries[change.name] = Entry(change.name, parsed.text, description, revision, at, by)
            effective.append(Change("put", change.name, parsed.text, description))
        if not effective:
            return base
        if base.version == 0:  # the first edit of a new lake also stores the seed it was made on
            entries = {name: replace(e, revision=1) if e.revision == 0 else e for name, e in entries.items()}
        new = RegistryVersion(version, at, by, tuple(effective), entries)
        try:
            self._write(new)
        except ObjectExistsError:
            raise self._conflict(version, base.version) from None
        return new

    def _write(self, version: RegistryVersion) -> None:
        self.store.create(keys.registry_version_key(version.version), version.to_json())
        self._cache[version.version] = version

    def _conflict(self, taken: int, expected: int) -> RegistryConflictError:
        """The error for an edit made against ``expected`` when version ``taken`` (or later) exists."""
        try:
            winner = self.read(max(self.versions()))
            who = f"version {winner.version} by {winner.by} at {winner.at}"
        except (NotFoundError, ValueError):
            who = f"version {taken}"
        return RegistryConflictError(
            f"the stored queries changed while this edit was made against version {expected} ({who}); "
            "nothing was applied: look at `lake queries list` and run the edit again"
        )

    def _seed_version(self) -> RegistryVersion:
        """Version 0: the seed declarations, revision 0 each, not stored."""
        if 0 not in self._cache:
            declared = read_declarations(self.seed_file)
            entries = {
                name: Entry(name, query, description, 0, "", "seed") for name, (query, description) in declared.items()
            }
            changes = tuple(Change("put", name, e.query, e.description) for name, e in sorted(entries.items()))
            self._cache[0] = RegistryVersion(0, "", "seed", changes, entries)
        return self._cache[0]
