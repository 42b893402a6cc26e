"""One rule from the metric names of other protocols (OTLP, Prometheus, InfluxDB) to the contract's ``[a-z0-9_.]{1,128}``.

:func:`metric_name` maps a foreign name as follows, so the three decoders
agree and a name that already fits comes through unchanged:

1. ASCII upper-case letters become lower-case (``CPU`` → ``cpu``);
2. every run of characters outside ``[a-z0-9_.]`` (space, ``:``, ``-``,
   ``/``, non-ASCII letters...) becomes one ``_`` (``CPU Usage`` →
   ``cpu_usage``, ``job:http_requests:rate5m`` →
   ``job_http_requests_rate5m``), as Prometheus's translation of OTLP names
   replaces invalid characters with ``_``;
3. a result longer than 128 characters keeps its first 119 and ends with
   ``_`` and 8 hex digits of the name's BLAKE2b digest, so long names that
   differ stay different.

When the name changes, :func:`metric_name` also returns the original, which
the decoders store in the tag :data:`ORIGINAL_NAME_TAG`, so nothing of the
name is lost. An empty name has no mapping (``None``): the point is
quarantined as ``bad_metric_name``.
"""

from __future__ import annotations

import functools
import hashlib
import re

from metrics_lake.lake_schemas.contract import METRIC_NAME

__all__ = ["ORIGINAL_NAME_TAG", "metric_name"]

#: Tag holding a protocol's original metric name when the mapping changed it.
ORIGINAL_NAME_TAG = "original_name"
_MAX_LEN = 128
_INVALID_RUN = re.compile(r"[^a-z0-9_.]+")


@functools.lru_cache(maxsize=65536)
def metric_name(name: str) -> tuple[str | None, str | None]:
    """(contract name, original name if it differs, else None) for a protocol's metric ``name``; see the module.

    Returns ``(None, None)`` for an empty name. Cached: fleets repeat the same names.
    """
    if METRIC_NAME.fullmatch(name):
        return name, None
    if not name:
        return None, None
    mapped = _INVALID_RUN.sub("_", name.translate(_LOWER))
    if len(mapped) > _MAX_LEN:
        digest = hashlib.blake2b(name.encode("utf-8", errors="surrogatepass"), digest_size=4).hexdigest()
        mapped = f"{mapped[: _MAX_LEN - 9]}_{digest}"
    return mapped, name


# Only ASCII letters are lowered (str.lower() would turn "İ" into two characters and "K" (Kelvin) into "k").
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
