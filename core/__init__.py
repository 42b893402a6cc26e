"""The core library of metrics-lake: the platform, the engine-independent kernels, the speed layer, maintenance.

The second of the package's five layers (bottom to top: lake_schemas, core, spark/agents/infra, quality, app, as
``pyproject.toml``'s import contract declares them; ``dags/`` sits on top, outside the package): imports only :mod:`metrics_lake.lake_schemas` (and third-party
libraries: pyarrow, delta-rs, boto3, pydantic), never Spark, Airflow or GX.
Its components, bottom to top, each importing only those below it (the
import contract "The core's components" in ``pyproject.toml``):

1. the platform:

   - :mod:`.keys`: the storage layout, every object key and the names in it;
   - :mod:`.config`: :class:`~.config.LakeSettings`, the one typed settings object (``LAKE_*``);
   - :mod:`.storage`: the :class:`~.storage.Store` contract and its local and S3 backends;
     :mod:`.s3_errors`: S3 failures classified by their error codes, whichever client reported them;
   - :mod:`.leases`: leases with fencing epochs (log partitions, table maintenance);
     :mod:`.parquet_layout`: how Parquet files are encoded;
   - :mod:`.log`: the partitioned log of immutable segments (producer, consumer, compaction, retention);
   - :mod:`.tables`: Delta tables through delta-rs and the exactly-once commit path;

2. :mod:`.kernels`: computations on Arrow data that every engine shares: the quantile
   sketch, window states, stored queries (one evaluator for the stream, the nightly job
   and the dashboard);
3. :mod:`.speed`: the speed layer's micro-batch, its progress as the tables record it, replay;
4. :mod:`.maintenance`: retention per resolution and table compaction.
"""

__all__ = [
    "config",
    "keys",
    "kernels",
    "leases",
    "log",
    "maintenance",
    "parquet_layout",
    "s3_errors",
    "speed",
    "storage",
    "tables",
]
