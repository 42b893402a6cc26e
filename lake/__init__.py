"""The core library of metrics-lake: configuration, errors, object storage, the segment log, Delta tables.

Layer 2 of 6: imports only ``metrics_lake.schemas`` (and third-party
libraries: pyarrow, delta-rs, boto3, pydantic), never Spark, Airflow or GX.

- :mod:`.config`: :class:`LakeSettings`, the one typed settings object (``LAKE_*``);
- :mod:`.errors`: :class:`LakeError` and its subclasses, the lake's one error root;
- :mod:`.storage`: the :class:`Store` contract and its local and S3 backends;
- :mod:`.log`: the partitioned log of immutable segments (producer, consumer, leases, compaction, retention);
- :mod:`.tables`: Delta tables through delta-rs, and the exactly-once commit path;
- :mod:`.table_compaction`, :mod:`.retention`: table maintenance (OPTIMIZE, retention per resolution, VACUUM);
- :mod:`.stored_queries`: the stored query grammar and parser.
"""

from __future__ import annotations

from metrics_lake.core.config import LakeSettings, load_settings
from metrics_lake.core.errors import (
    AccessDeniedError,
    BucketNotFoundError,
    CheckFailedError,
    ConfigError,
    CredentialsError,
    InputError,
    LakeError,
    NotFoundError,
    StorageError,
    StorageUnavailableError,
)
from metrics_lake.core.storage import LocalStore, S3Store, Store, open_store

__all__ = [
    "AccessDeniedError",
    "BucketNotFoundError",
    "CheckFailedError",
    "ConfigError",
    "CredentialsError",
    "InputError",
    "LakeError",
    "LakeSettings",
    "LocalStore",
    "NotFoundError",
    "S3Store",
    "StorageError",
    "StorageUnavailableError",
    "Store",
    "load_settings",
    "open_store",
]
