"""The config store: the stored queries and alert rules operators manage at run time, as versioned lake state.

Every edit writes one new immutable object, ``registry/versions/<n>.json``
(:func:`metrics_lake.core.keys.config_version_key`), holding the whole
config after the edit and the edit itself (what changed, who, when). The
newest version is the config store; the older ones are its history. An edit is
made against the version it read and written with a create-if-absent of the
next version number (``If-None-Match: *`` on S3, ``O_EXCL``-style on a local
folder), so of two operators editing at once exactly one wins and the other
gets :class:`~metrics_lake.lake_schemas.errors.ConfigConflictError` (exit
75: nothing of the loser's edit was applied; read again and retry). The same
compare-and-create is how Mimir's ruler store and Delta's own log order
their writers.

The config store holds two kinds of entry, each with its own names: **stored
queries** (:mod:`metrics_lake.core.kernels.stored_queries`) and **alert
rules** (:mod:`metrics_lake.core.kernels.alert_rules`). A version is checked
whole before it is written: every threshold rule must name a stored query of
the same version that computes its aggregate, so removing or changing a query
a rule uses is refused, naming the rule, and nothing is half-applied.

A lake that has no version yet reads the declarations shipped with the
package (``lake_schemas/stored_queries.toml``: ``[[queries]]`` and
``[[alerts]]``) as version 0; the first writer (``lake stream`` on start, or
any edit) stores them as version 1, so later package upgrades never change
an existing lake's queries or rules.

Each entry keeps a **revision**: the version at which its text last changed
(a new description alone does not change it). Readers use it to know
whether what a table holds for a query is of its current definition: the
speed layer adopts a new revision on its next micro-batch, the backfill
(:mod:`metrics_lake.core.maintenance.query_backfill`) recomputes the closed
windows (both record the revision they applied in ``query_results``); the
``alerts`` table records the revision of the rule each transition came from.

Version object (JSON, UTF-8; ``alerts`` and a change's ``kind`` are absent
in versions written before alert rules existed)::

    {"format": 1, "version": 7, "at": "2026-11-23T10:00:00+00:00", "by": "alice",
     "changes": [{"action": "put", "kind": "query", "name": "...", "query": "FROM ...", "description": "..."},
                 {"action": "put", "kind": "alert", "name": "...", "rule": "ABSENT ...", "description": "..."}],
     "queries": {"<name>": {"query": "FROM ...", "description": "...", "revision": 7,
                            "changed_at": "...", "changed_by": "alice"}},
     "alerts": {"<name>": {"rule": "q.p99 > 250 FOR 3m", "description": "...", "revision": 7,
                           "changed_at": "...", "changed_by": "alice"}}}
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from metrics_lake.core import keys
from metrics_lake.core.config import default_author
from metrics_lake.core.kernels.alert_rules import DAY_S, AlertRule, check_against_queries, parse_rule
from metrics_lake.core.kernels.stored_queries import (
    DEFAULT_FILE,
    StoredQuery,
    load_stored_queries,
    parse_query,
    read_toml,
)
from metrics_lake.core.storage import ObjectExistsError, Store
from metrics_lake.lake_schemas.errors import (
    AlertRuleError,
    ConfigConflictError,
    IntegrityError,
    NotFoundError,
    StoredQueryError,
)

__all__ = [
    "ALERT",
    "QUERY",
    "Change",
    "Entry",
    "ConfigStore",
    "ConfigVersion",
    "declared_changes",
    "read_declarations",
]

#: The format of a version object; a reader refuses others rather than misread them.
FORMAT = 1
#: The two kinds of entry: stored queries and alert rules.
QUERY, ALERT = "query", "alert"
_KINDS = {QUERY: ("queries", "query", "stored query"), ALERT: ("alerts", "rule", "alert rule")}
#: Absence rules' FOR is checked against this lookback when read back (edits check the lake's own).
_READ_LOOKBACK_S = 10**9


@dataclass(frozen=True)
class Entry:
    """One stored query or alert rule as the config store holds it.

    ``text``: the query or the rule; ``revision``: the config version at
    which ``text`` last changed; ``changed_at`` (ISO 8601, UTC) and
    ``changed_by``: the last edit of any kind (text or description).
    """

    name: str
    text: str
    description: str
    revision: int
    changed_at: str
    changed_by: str
    kind: str = QUERY

    @property
    def query(self) -> str:
        """A stored query's text (the name the version object and the API give it)."""
        return self.text

    def parsed(self) -> StoredQuery:
        """A stored query's entry as a :class:`StoredQuery` carrying its revision."""
        return replace(parse_query(self.name, self.text, self.description), revision=self.revision)

    def rule(self, absence_lookback_s: int = _READ_LOOKBACK_S) -> AlertRule:
        """An alert rule's entry as an :class:`AlertRule` carrying its revision."""
        parsed = parse_rule(self.name, self.text, self.description, absence_lookback_s=absence_lookback_s)
        return replace(parsed, revision=self.revision)

    def fields(self) -> dict:
        """The entry as the version object stores it."""
        return {
            _KINDS[self.kind][1]: self.text,
            "description": self.description,
            "revision": self.revision,
            "changed_at": self.changed_at,
            "changed_by": self.changed_by,
        }


@dataclass(frozen=True)
class Change:
    """One edit: ``put`` an entry (new or changed) or ``delete`` one; ``text``/``description`` for ``put`` only.

    ``kind``: :data:`QUERY` (a stored query) or :data:`ALERT` (an alert rule).
    """

    action: str
    name: str
    text: str | None = None
    description: str | None = None
    kind: str = QUERY

    def describe(self) -> str:
        """One line for a dry run or a history listing: ``+ name: FROM …`` / ``- name`` (``alert`` before rules')."""
        what = "alert " if self.kind == ALERT else ""
        return f"- {what}{self.name}" if self.action == "delete" else f"+ {what}{self.name}: {self.text}"

    def to_json(self) -> dict:
        """The change as the version object stores it."""
        doc = {"action": self.action, "kind": self.kind, "name": self.name}
        if self.text is not None:
            doc[_KINDS[self.kind][1]] = self.text
        if self.description is not None:
            doc["description"] = self.description
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> Change:
        """A change read back from a version object."""
        kind = doc.get("kind", QUERY)
        return cls(doc["action"], doc["name"], doc.get(_KINDS[kind][1]), doc.get("description"), kind)


@dataclass(frozen=True)
class ConfigVersion:
    """The config store as of one version: its entries by name and the edit that made it (``version`` 0: the seed).

    ``entries``: the stored queries; ``rules``: the alert rules.
    """

    version: int
    at: str
    by: str
    changes: tuple[Change, ...]
    entries: dict[str, Entry] = field(default_factory=dict)
    rules: dict[str, Entry] = field(default_factory=dict)

    def queries(self) -> list[StoredQuery]:
        """Every stored query, parsed, sorted by name."""
        return [self.entries[name].parsed() for name in sorted(self.entries)]

    def alert_rules(self) -> list[AlertRule]:
        """Every alert rule, parsed, sorted by name."""
        return [self.rules[name].rule() for name in sorted(self.rules)]

    def of_kind(self, kind: str) -> dict[str, Entry]:
        """The entries of ``kind`` (:data:`QUERY` or :data:`ALERT`) by name."""
        return self.rules if kind == ALERT else self.entries

    def entry(self, name: str, kind: str = QUERY) -> Entry:
        """The entry ``name`` of ``kind``; :class:`NotFoundError` naming the known ones if there is none."""
        entries = self.of_kind(kind)
        if name not in entries:
            known = ", ".join(sorted(entries)) or "none"
            what = _KINDS[kind][2]
            raise NotFoundError(f"no {what} {name!r} (config version {self.version}; known: {known})")
        return entries[name]

    def to_json(self) -> bytes:
        """The version object (module docstring)."""
        doc = {
            "format": FORMAT,
            "version": self.version,
            "at": self.at,
            "by": self.by,
            "changes": [c.to_json() for c in self.changes],
            "queries": {name: e.fields() for name, e in sorted(self.entries.items())},
            "alerts": {name: e.fields() for name, e in sorted(self.rules.items())},
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, key: str) -> ConfigVersion:
        """Parse a version object; :class:`IntegrityError` naming ``key`` if it is not one this lake wrote."""
        try:
            doc = json.loads(data)
            if doc.get("format") != FORMAT:
                raise IntegrityError(f"config store object {key} has format {doc.get('format')!r}, not {FORMAT}")
            found = {}
            for kind, (section, text_key, _) in _KINDS.items():
                found[kind] = {
                    name: Entry(
                        name,
                        fields[text_key],
                        fields["description"],
                        fields["revision"],
                        fields["changed_at"],
                        fields["changed_by"],
                        kind,
                    )
                    for name, fields in doc.get(section, {}).items()
                }
            changes = tuple(Change.from_json(c) for c in doc["changes"])
            return cls(int(doc["version"]), doc["at"], doc["by"], changes, found[QUERY], found[ALERT])
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"config store object {key} is not a config version ({exc}); restore it") from None


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def read_declarations(path: str | Path, kind: str = QUERY) -> dict[str, tuple[str, str]]:
    """``{name: (text, description)}`` of a declarations TOML file: its ``[[queries]]``, or with ``kind`` ALERT its
    ``[[alerts]]`` (keys ``name``, ``rule``, optional ``description``).

    Every entry is parsed, so a bad one fails here, naming it and the clause
    (:class:`StoredQueryError`, :class:`AlertRuleError`), before anything is
    applied; a duplicate name fails too.
    """
    if kind == QUERY:
        return {q.name: (q.text, q.description) for q in load_stored_queries(path)}
    path = Path(path)
    doc = read_toml(path, AlertRuleError, "declarations file")
    declared: dict[str, tuple[str, str]] = {}
    for i, item in enumerate(doc.get("alerts", [])):
        missing = {"name", "rule"} - set(item)
        if missing:
            raise AlertRuleError(f"{path}: alerts[{i}] lacks {sorted(missing)}")
        if item["name"] in declared:
            raise AlertRuleError(f"{path}: alert rule name {item['name']!r} used twice")
        rule = parse_rule(item["name"], item["rule"], item.get("description", ""))
        declared[rule.name] = (rule.text, rule.description)
    return declared


def declared_changes(current: ConfigVersion, declared: dict[str, tuple[str, str]], kind: str = QUERY) -> list[Change]:
    """The edits that make ``current``'s entries of ``kind`` exactly ``declared`` (``{name: (text, description)}``)."""
    entries = current.of_kind(kind)
    changes = [
        Change("put", name, text, description, kind)
        for name, (text, description) in sorted(declared.items())
        if name not in entries or (entries[name].text, entries[name].description) != (text, description)
    ]
    changes += [Change("delete", name, kind=kind) for name in sorted(set(entries) - set(declared))]
    return changes


class ConfigStore:
    """The config store of one lake (module docstring): read its current version, apply edits, list its history.

    ``seed``: the declarations a lake without a config store starts from
    (default: the shipped ``stored_queries.toml``); ``absence_lookback_s``:
    the lake's absence lookback (``LAKE_ALERT_ABSENCE_LOOKBACK_SECONDS``),
    which an absence rule's FOR must stay under. Reads are cached by version,
    so polling it every micro-batch costs one LIST.
    """

    def __init__(self, store: Store, seed: str | Path | None = None, *, absence_lookback_s: int = DAY_S) -> None:
        self.store = store
        self.seed_file = Path(seed or DEFAULT_FILE)
        self.absence_lookback_s = absence_lookback_s
        self._cache: dict[int, ConfigVersion] = {}

    def versions(self) -> list[int]:
        """Every stored version number, ascending (empty for a lake that has none yet)."""
        return [int(name.removesuffix(".json")) for name in self.store.list(keys.CONFIG_VERSIONS_PREFIX)]

    def read(self, version: int) -> ConfigVersion:
        """Version ``version`` (0: the seed); :class:`NotFoundError` if it does not exist."""
        if version == 0:
            return self._seed_version()
        if version not in self._cache:
            key = keys.config_version_key(version)
            try:
                data = self.store.read(key)
            except FileNotFoundError:
                raise NotFoundError(f"no config version {version}: see `lake queries history`") from None
            self._cache[version] = ConfigVersion.from_json(data, key)
        return self._cache[version]

    def current(self) -> ConfigVersion:
        """The newest version, or the seed (version 0) if nothing was stored yet."""
        versions = self.versions()
        return self.read(versions[-1]) if versions else self._seed_version()

    def history(self, name: str | None = None, kind: str | None = None) -> list[ConfigVersion]:
        """Every stored version, oldest first; with ``name`` (and ``kind``), only those whose edit touched it."""
        versions = [self.read(v) for v in self.versions()]
        if name is not None:
            versions = [v for v in versions if any(_touches(c, name, kind) for c in v.changes)]
        return versions

    def ensure_seeded(self) -> ConfigVersion:
        """Store the seed as version 1 if the lake has no config store yet; the current version either way."""
        if not self.versions():
            seed = self._seed_version()
            try:
                at = _now()
                self._write(
                    replace(
                        seed,
                        version=1,
                        at=at,
                        entries={n: replace(e, revision=1, changed_at=at) for n, e in seed.entries.items()},
                        rules={n: replace(e, revision=1, changed_at=at) for n, e in seed.rules.items()},
                    )
                )
            except ObjectExistsError:
                pass  # another process seeded it first: the same declarations or an edit on top of them
        return self.current()

    def apply(self, changes: list[Change], *, by: str | None = None, expected: int | None = None) -> ConfigVersion:
        """Apply ``changes`` as one new version; returns it (or the current one if they change nothing).

        ``expected``: the version the caller's edit was made against (e.g. an
        HTTP ``If-Match``); default the version read here. Raises
        :class:`StoredQueryError` or :class:`AlertRuleError` for a bad entry,
        a duplicate name in ``changes``, or a version whose rules would name a
        missing query or aggregate; :class:`NotFoundError` for deleting an
        unknown entry (nothing is applied then); :class:`ConfigConflictError`
        if the config store moved past ``expected`` or another edit won the race.
        """
        base = self.current()
        if expected is not None and expected != base.version:
            raise self._conflict(base.version, expected)
        names = [(c.kind, c.name) for c in changes]
        if len(set(names)) != len(names):
            twice = sorted({n for k, n in names if names.count((k, n)) > 1})
            error = AlertRuleError if any(k == ALERT for k, _ in names) else StoredQueryError
            raise error(f"an edit names an entry twice: {twice}")
        by, at = by or default_author(), _now()
        version = base.version + 1
        found = {QUERY: dict(base.entries), ALERT: dict(base.rules)}
        effective = []
        for change in changes:
            entries = found[change.kind]
            if change.action == "delete":
                base.entry(change.name, change.kind)  # NotFoundError names the known ones
                del entries[change.name]
                effective.append(change)
                continue
            if change.action != "put" or change.text is None:
                raise ValueError(f"not a config store change: {change}")  # programming error
            text = self._checked_text(change)
            old = entries.get(change.name)
            description = change.description if change.description is not None else (old.description if old else "")
            if old is not None and (old.text, old.description) == (text, description):
                continue
            revision = old.revision if old is not None and old.text == text else version
            entries[change.name] = Entry(change.name, text, description, revision, at, by, change.kind)
            effective.append(Change("put", change.name, text, description, change.kind))
        if not effective:
            return base
        _check_rules(found[QUERY], found[ALERT], effective)
        if base.version == 0:  # the first edit of a new lake also stores the seed it was made on
            found = {
                k: {n: replace(e, revision=1) if e.revision == 0 else e for n, e in v.items()} for k, v in found.items()
            }
        new = ConfigVersion(version, at, by, tuple(effective), found[QUERY], found[ALERT])
        try:
            self._write(new)
        except ObjectExistsError:
            raise self._conflict(version, base.version) from None
        return new

    def _checked_text(self, change: Change) -> str:
        """The normalised text of a ``put``; raises the kind's error naming the clause."""
        if change.kind == ALERT:
            rule = parse_rule(change.name, change.text or "", absence_lookback_s=self.absence_lookback_s)
            return rule.text
        return parse_query(change.name, change.text or "", change.description or "").text

    def _write(self, version: ConfigVersion) -> None:
        self.store.create(keys.config_version_key(version.version), version.to_json())
        self._cache[version.version] = version

    def _conflict(self, taken: int, expected: int) -> ConfigConflictError:
        """The error for an edit made against ``expected`` when version ``taken`` (or later) exists."""
        try:
            winner = self.read(max(self.versions()))
            who = f"version {winner.version} by {winner.by} at {winner.at}"
        except (NotFoundError, ValueError):
            who = f"version {taken}"
        return ConfigConflictError(
            f"the config store changed while this edit was made against version {expected} ({who}); "
            "nothing was applied: look at `lake queries list` / `lake alerts list` and run the edit again"
        )

    def _seed_version(self) -> ConfigVersion:
        """Version 0: the seed declarations, revision 0 each, not stored."""
        if 0 not in self._cache:
            found = {}
            for kind in _KINDS:
                declared = read_declarations(self.seed_file, kind)
                found[kind] = {
                    name: Entry(name, text, description, 0, "", "seed", kind)
                    for name, (text, description) in declared.items()
                }
            _check_rules(found[QUERY], found[ALERT], [])
            changes = tuple(
                Change("put", name, e.text, e.description, kind)
                for kind in _KINDS
                for name, e in sorted(found[kind].items())
            )
            self._cache[0] = ConfigVersion(0, "", "seed", changes, found[QUERY], found[ALERT])
        return self._cache[0]


def _touches(change: Change, name: str, kind: str | None) -> bool:
    return change.name == name and (kind is None or change.kind == kind)


def _check_rules(queries: dict[str, Entry], rules: dict[str, Entry], changes: list[Change]) -> None:
    """Raise if a rule of the version names a query (or aggregate) the version lacks, blaming the query edit that
    broke it where the rule itself did not change."""
    parsed = {name: entry.parsed() for name, entry in queries.items()}
    edited = {c.name for c in changes if c.kind == QUERY}
    for name in sorted(rules):
        rule = rules[name].rule()
        try:
            check_against_queries(rule, parsed)
        except AlertRuleError as exc:
            if rule.query in edited:
                action = "removes" if rule.query not in parsed else "changes"
                raise AlertRuleError(
                    f"this edit {action} stored query {rule.query!r}, which alert rule {name!r} ({rule.text}) uses: "
                    "change or remove the rule first"
                ) from None
            raise exc from None
