"""The one typed settings object of metrics-lake.

Values come from, highest priority first: keyword arguments, ``LAKE_*``
environment variables, a ``lake.toml`` in the working directory, then the
defaults below. A bad value fails at start with the variable's name (pydantic
reports the field; :func:`load_settings` turns it into ``LAKE_<FIELD>``).
Secrets are :class:`pydantic.SecretStr` so they never print.
"""

from __future__ import annotations

import getpass
import os
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from metrics_lake.core.keys import INVENTORY_TOPIC, NAME_PATTERN
from metrics_lake.lake_schemas.errors import ConfigError
from metrics_lake.lake_schemas.tables import Table

__all__ = ["LakeSettings", "default_author", "load_settings"]


class LakeSettings(BaseSettings):
    """Configuration for every lake command (docs/reference/configuration.md): one ``LAKE_*`` variable per field."""

    model_config = SettingsConfigDict(env_prefix="LAKE_", toml_file="lake.toml", extra="forbid", frozen=True)

    root: str = Field(
        "./lakehouse",
        description="Where the lake lives: a local directory or s3://bucket/prefix.",
    )
    s3_endpoint: str | None = Field(None, description="S3 endpoint URL (MinIO, SeaweedFS); unset for AWS.")
    s3_access_key: SecretStr | None = Field(
        None, description="S3 access key id; unset: the usual AWS credential chain (boto3 and delta-rs both read it)."
    )
    s3_secret_key: SecretStr | None = Field(None, description="S3 secret key of LAKE_S3_ACCESS_KEY.")
    admin_token: SecretStr | None = Field(
        None,
        description="A bootstrap admin credential, accepted beside the admin tokens of `lake tokens` by the "
        "dashboard's write endpoints (PUT/DELETE /api/queries/…) and the gateway; unset: only those tokens.",
    )
    token: SecretStr | None = Field(
        None,
        description="The token agents, `lake produce --gateway` and the importer send to the gateway "
        "(Authorization: Bearer); see also LAKE_TOKEN_FILE.",
    )
    token_file: str | None = Field(
        None, description="A file holding the token clients send (read at start), instead of LAKE_TOKEN."
    )
    tls_cert: str | None = Field(None, description="PEM certificate chain the gateway and dashboard serve HTTPS with.")
    tls_key: str | None = Field(None, description="PEM private key of LAKE_TLS_CERT.")
    tls_client_ca: str | None = Field(
        None, description="PEM CA the gateway and dashboard require client certificates from (mutual TLS)."
    )
    tls_ca: str | None = Field(
        None, description="PEM CA clients (agents, importer) verify the gateway's certificate with (default: system's)."
    )
    s3_region: str = Field("us-east-1", description="S3 region.")
    checkpoint_dir: str = Field(
        "./lakehouse/_checkpoints",
        description="Spark streaming checkpoints. Always a local or shared file system path, "
        "never s3:// (Spark checkpoints go through Hadoop's FileSystem).",
    )
    spark_master: str = Field(
        "local[*]", description="Spark master: local[N], or spark://host:port for a standalone cluster."
    )
    spark_driver_java_options: str = Field(
        "-XX:TieredStopAtLevel=1",
        description="Extra JVM options of the Spark driver. The default compiles with HotSpot's C1 only: "
        "the driver JVM mostly plans and moves Arrow batches (Python workers compute), so C2's "
        "compile threads cost more than they return on few cores (see spark/session.py). Empty: Java's defaults.",
    )
    topic: str = Field(
        "metrics", pattern=NAME_PATTERN, description="Log topic: a lower-case letter, then [a-z0-9_], 64 at most."
    )
    partitions: int = Field(4, ge=1, le=1024, description="Partitions of a newly created topic.")
    segment_roll_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Producer flushes a partition once its buffer holds this many bytes."
    )
    segment_roll_ms: int = Field(
        1000, ge=10, description="Producer flushes a partition buffer at the latest after this many ms."
    )
    watermark_seconds: int = Field(120, ge=0, description="Event-time lateness the speed layer waits for.")
    max_records_per_batch: int = Field(
        16_000_000,
        ge=1,
        description="Most log records one micro-batch reads (Spark read limit). A backlog (`lake stream --once`, a "
        "stream catching up) goes faster in big batches: each batch re-reads and rewrites the windows and stored-"
        "query results it touches; lower it if the driver runs out of memory (it holds a batch's window states).",
    )
    trigger_seconds: float = Field(5.0, gt=0, description="Micro-batch interval of `lake stream`.")
    shuffle_partitions: int = Field(
        4, ge=1, description="spark.sql.shuffle.partitions for new streaming checkpoints (fixed once a query has run)."
    )
    lease_ttl_seconds: float = Field(
        10.0, ge=1, description="Partition lease time-to-live; a dead writer's partitions are free after this."
    )
    gateway_host: str = Field("127.0.0.1", description="Address `lake gateway` listens on.")
    gateway_port: int = Field(8787, ge=0, le=65535, description="Port `lake gateway` listens on (0: any free port).")
    gateway_buffer_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Gateway answers 429 once this many bytes await a durable flush."
    )
    gateway_ack_timeout_seconds: float = Field(
        10.0, gt=0, description="Gateway answers 503 if a batch is not durable within this time."
    )
    gateway_request_window_seconds: float = Field(
        120.0,
        ge=0,
        description="How long the gateway recognises a remote-write body it already appended (a sender's retry), "
        "across its own restarts too; 0 only while the first copy is buffered. Costs about 200 bytes of memory "
        "per request and partition it wrote to within the window.",
    )
    gateway_max_body_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="Gateway answers 413 to a request body over this many bytes, as received or decompressed.",
    )
    gateway_request_timeout_seconds: float = Field(
        30.0, gt=0, description="A request's headers, then its body, must arrive within this time (else 408/close)."
    )
    gateway_idle_timeout_seconds: float = Field(
        15.0, ge=1, description="Gateway closes a keep-alive connection idle for this long."
    )
    gateway_ops_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Port serving only /healthz and /metrics without credentials (for probes and Prometheus).",
    )
    gateway_ops_host: str = Field("127.0.0.1", description="Address of the gateway's /healthz and /metrics port.")
    gateway_token_rate: float | None = Field(
        None,
        gt=0,
        description="Events/s each token (or tenant) may send when its own --rate is unset; unset: unlimited.",
    )
    gateway_token_burst: int | None = Field(
        None, ge=1, description="Events a token (or tenant) may send at once (the bucket's size); default: 5 s of rate."
    )
    gateway_max_connections: int = Field(
        1000, ge=1, description="Open connections the gateway serves at once; above it new requests get 503."
    )
    gateway_log_compaction_seconds: float = Field(
        30.0,
        ge=0,
        description="How often `lake gateway` merges its own partitions' small segments (log compaction up to "
        "LAKE_LOG_COMPACTION_TARGET_BYTES), so that flushing every few milliseconds keeps the partition index "
        "small; 0: never (leave it to `lake compact --log-only`).",
    )
    retention_log_days: float = Field(7.0, gt=0, description="Log segments are deleted this many days after append.")
    retention_bronze_days: int = Field(
        7,
        ge=1,
        description=f"Days of {Table.BRONZE_EVENTS} and {Table.QUARANTINE_EVENTS} kept (by event/ingest date).",
    )
    retention_windows_days: int = Field(
        30,
        ge=1,
        description=f"Days of {Table.METRIC_WINDOWS_1M}, {Table.LAMBDA_RECONCILIATION}, {Table.QUERY_RESULTS} and "
        f"{Table.ALERTS} kept.",
    )
    retention_rollup_1h_days: int = Field(365, ge=1, description=f"Days of {Table.METRIC_ROLLUP_1H} kept.")
    retention_sql_audit_days: int = Field(
        90, ge=1, description=f"Days of {Table.SQL_AUDIT} kept: who ran which statement through the SQL endpoint."
    )
    retention_rollup_1d_days: int | None = Field(
        None, ge=1, description=f"Days of {Table.METRIC_ROLLUP_1D} kept (unset: forever)."
    )
    vacuum_retention_hours: int = Field(
        168,
        ge=1,
        description="VACUUM deletes data files unreferenced for this long; time travel reaches back this far "
        "(Delta's default delta.deletedFileRetentionDuration, 7 days). Keep it above the longest query or stream batch.",
    )
    delta_log_retention_hours: int = Field(
        1,
        ge=1,
        description="The tables `lake stream` writes every batch keep their Delta log, and the tombstones of the "
        "files they removed, this long: time travel on them reaches back this far (at most "
        "LAKE_VACUUM_RETENTION_HOURS). Each batch adds an entry, and on a local lake every open, refresh and commit "
        "of a table lists them all: a batch of 5,000 events took 1.16x as long with an hour of a 1 s trigger's "
        "entries as with 10 minutes', 1.86x with 6 hours (docs/performance.md). On S3 a listing starts from a key: "
        "a longer retention costs little there.",
    )
    compaction_interval_seconds: float = Field(
        30.0,
        ge=0,
        description="`lake stream` merges the small files its batches leave this often, on a thread beside its "
        "batches (continuous compaction; seconds from the end of one round to the start of the next; 0: never, "
        "leave it to `lake compact`).",
    )
    compaction_target_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1024,
        description="Continuous compaction's file size: files this large are done; smaller ones are merged by size "
        "tier.",
    )
    compaction_min_files: int = Field(
        8,
        ge=2,
        description="Continuous compaction merges a day's files of one size tier once this many have gathered "
        "(the tiers' size factor too): a day keeps fewer than 3x this many small files.",
    )
    freed_memory_keep_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="`lake stream` (after each batch) and `lake gateway` (every second) give the memory malloc keeps "
        "free for reuse back to the system once their resident size has grown this much above its low since they "
        "last did, so it swings by about this much; 0: after every batch and every second.",
    )
    vacuum_interval_seconds: float = Field(
        3600.0,
        ge=0,
        description="`lake stream` vacuums its tables this often (files unreferenced for "
        "LAKE_VACUUM_RETENTION_HOURS); 0: never, leave it to `lake retention`.",
    )
    segment_delete_delay_seconds: float = Field(
        300.0, ge=0, description="Log segments replaced by compaction or retention are deleted after this delay."
    )
    inventory_tombstone_retention_seconds: float = Field(
        86_400.0,
        ge=0,
        description="Log compaction of the inventory topic keeps a removed server's tombstone this long (Kafka's "
        "delete.retention.ms); superseded labels are kept as long as log segments (LAKE_RETENTION_LOG_DAYS), "
        "since events still in the log are joined with the labels in force when they were appended.",
    )
    log_compaction_target_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="Log compaction merges small segments up to this size."
    )
    table_compaction_target_bytes: int = Field(
        128 * 1024 * 1024, ge=1024 * 1024, description="Delta compaction (OPTIMIZE) target file size."
    )
    limit_series_per_metric: int = Field(
        150_000,
        ge=0,
        description="Cardinality limit: distinct servers (series) per metric per hour in the topic, shared evenly "
        "among its partitions (Mimir's max_global_series_per_metric); events of further series go to quarantine "
        "with reason cardinality_limit. 0: no limit.",
    )
    limit_values_per_label: int = Field(
        100_000,
        ge=0,
        description="Cardinality limit: distinct values of one tag name per hour in the topic, shared evenly among "
        "its partitions; events bringing further values go to quarantine. 0: no limit.",
    )
    limit_labels_per_event: int = Field(
        30,
        ge=0,
        description="Cardinality limit: tags one event may carry (Mimir's max_label_names_per_series); events with "
        "more go to quarantine. 0: no limit.",
    )
    quality_dir: str | None = Field(
        None,
        description="Local directory of the GX project, data docs and trend plot "
        "(default: <root>/quality for a local lake, ./.lake-quality for S3, whose docs are also copied to quality/).",
    )
    quality_keep_runs: int = Field(30, ge=1, description="Validation results (and data docs pages) kept per suite.")
    quality_clock_skew_seconds: int = Field(300, ge=0, description="Event times up to this far in the future pass.")
    quality_freshness_lag_seconds: int = Field(900, ge=0, description="Today's newest window must be at most this old.")
    quality_volume_band: float = Field(
        0.5, gt=0, description="A day's row count must lie within this fraction of the trailing 7-day median."
    )
    quality_reconciliation_tolerance: float = Field(
        0.01, ge=0, description="Largest relative speed vs batch count difference per metric and day."
    )
    alertmanager_url: str | None = Field(
        None,
        description="Prometheus Alertmanager(s) that `lake stream` (and `lake alerts notify`) posts firing and "
        "resolved alerts to (API v2, e.g. http://127.0.0.1:9093); a comma-separated list for a high-availability "
        "pair or cluster: every alert goes to each, Alertmanager deduplicates. Unset: alerts are only recorded in "
        "the alerts table.",
    )
    alert_evaluation_interval_seconds: int = Field(
        60,
        ge=1,
        description="Threshold rules are evaluated at every multiple of this many seconds (epoch-aligned) up to the "
        "event clock, each step on the windows that ended by then (Prometheus's evaluation_interval).",
    )
    nodata_seconds: int = Field(
        60,
        ge=1,
        description="The built-in LakeNoData alert fires when the lake received no record at all for this long.",
    )
    alert_evaluation_delay_seconds: float = Field(
        0.0,
        ge=0,
        description="Threshold rules are evaluated this long behind the stream's event clock, so that events "
        "arriving a little late are in the windows they read (Mimir's ruler evaluation delay).",
    )
    alert_absence_lookback_seconds: int = Field(
        86_400,
        ge=60,
        description=f"A server silent for longer is no longer expected: absence rules stop firing for it "
        f"(and {Table.LAST_SEEN} forgets it).",
    )
    alert_resend_seconds: float = Field(
        60.0,
        gt=0,
        description="Firing alerts are sent to Alertmanager again this often (Prometheus's "
        "--rules.alert.resend-delay); each is valid for four times as long.",
    )
    alert_notify_timeout_seconds: float = Field(
        5.0, gt=0, description="How long one POST to Alertmanager may take before it is retried later."
    )
    dashboard_url: str = Field(
        "http://127.0.0.1:8050",
        description="Where operators open the dashboard: alerts link to it (Alertmanager's generatorURL).",
    )
    spool_dir: str = Field(
        "./.lake-spool", description="Local disk buffer where agents keep batches the gateway has not acknowledged."
    )

    @field_validator("root")
    @classmethod
    def _check_root(cls, value: str) -> str:
        if "://" in value and not value.startswith("s3://"):
            raise ConfigError(f"{value!r} is not a supported root; use a local path or s3://bucket/prefix")
        return value.rstrip("/") or "/"

    @field_validator("topic")
    @classmethod
    def _check_topic(cls, value: str) -> str:
        if value == INVENTORY_TOPIC:
            raise ConfigError(f"{value!r} is the server inventory's topic; choose another name for metric events")
        return value

    @field_validator("checkpoint_dir")
    @classmethod
    def _check_checkpoint_dir(cls, value: str) -> str:
        if "://" in value:
            raise ConfigError("must be a local or shared file system path (Spark checkpoints use Hadoop's FileSystem)")
        return value

    @field_validator("alertmanager_url")
    @classmethod
    def _check_alertmanager_urls(cls, value: str | None) -> str | None:
        if value is None:
            return None
        urls = [u.strip().rstrip("/") for u in value.split(",")]
        for url in urls:
            if not _is_http_url(url):
                raise ConfigError(f"{url!r} in the Alertmanager list is not an http:// or https:// URL with a host")
        if len(set(urls)) != len(urls):
            raise ConfigError(f"{value!r} names an Alertmanager twice")
        return ",".join(urls)

    @property
    def alertmanager_urls(self) -> list[str]:
        """The Alertmanagers alerts go to (``LAKE_ALERTMANAGER_URL`` split at commas); empty when unset."""
        return [] if self.alertmanager_url is None else self.alertmanager_url.split(",")

    @field_validator("dashboard_url")
    @classmethod
    def _check_http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ConfigError(f"{value!r} is not an http:// or https:// URL")
        return None if value is None else value.rstrip("/")

    def client_token(self) -> str | None:
        """The token clients send to the gateway: ``LAKE_TOKEN``, else the file ``LAKE_TOKEN_FILE``, else None.

        Raises :class:`ConfigError` if the file cannot be read or is empty.
        """
        if self.token is not None:
            return self.token.get_secret_value()
        if self.token_file is None:
            return None
        try:
            token = Path(self.token_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"LAKE_TOKEN_FILE {self.token_file}: cannot read it ({exc.strerror})") from None
        if not token:
            raise ConfigError(
                f"LAKE_TOKEN_FILE {self.token_file} is empty; put the token of `lake tokens create` in it"
            )
        return token

    @property
    def is_s3(self) -> bool:
        """True when the lake lives in S3-compatible object storage."""
        return self.root.startswith("s3://")

    @property
    def keyed_compaction(self) -> dict[str, int]:
        """The keyed-compaction arguments of :func:`metrics_lake.core.log.segment_compaction.compact_log`, in ms."""
        return {
            "min_lag_ms": int(self.retention_log_days * 86_400_000),
            "tombstone_retention_ms": int(self.inventory_tombstone_retention_seconds * 1000),
        }

    @property
    def quality_path(self) -> Path:
        """The local directory of the data-quality project (see ``quality_dir``)."""
        if self.quality_dir:
            return Path(self.quality_dir).expanduser().resolve()
        return Path(".lake-quality").resolve() if self.is_s3 else Path(self.root).expanduser().resolve() / "quality"

    @property
    def checkpoint_path(self) -> Path:
        """The checkpoint directory as an absolute local path."""
        return Path(self.checkpoint_dir).expanduser().resolve()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Environment overrides ``lake.toml``; explicit arguments override both."""
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))


def _is_http_url(url: str) -> bool:
    """Whether ``url`` is an http(s) URL with a host and, if given, a valid port."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _secret_fields() -> set[str]:
    """Names of the settings that hold secrets (typed ``SecretStr``): their values never appear in errors."""
    return {name for name, info in LakeSettings.model_fields.items() if "SecretStr" in str(info.annotation)}


def load_settings(**overrides) -> LakeSettings:
    """Build :class:`LakeSettings`, turning validation errors into :class:`ConfigError`.

    ``overrides`` with value ``None`` are ignored, so CLI flags can pass
    through unset options. Raises :class:`ConfigError` naming each bad
    ``LAKE_*`` variable and why it is bad (one line, problems separated by
    ``;``), or saying that ``lake.toml`` is not valid TOML.
    """
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return LakeSettings(**given)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"])
            shown = "<hidden>" if field in _secret_fields() else repr(error.get("input"))  # secrets never print
            problems.append(f"LAKE_{field.upper()}: {error['msg']} (got {shown})")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"lake.toml in {Path.cwd()} is not valid TOML: {exc}") from None


def default_author() -> str:
    """Who a change is recorded as when the caller does not say (config store edits, tokens): ``LAKE_AUTHOR``, else
    the OS user."""
    try:
        return os.environ.get("LAKE_AUTHOR") or getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return f"uid-{os.getuid()}"
