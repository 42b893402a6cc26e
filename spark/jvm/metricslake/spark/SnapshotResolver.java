package metricslake.spark;

/**
 * Resolves a lake table's Delta snapshot into the Parquet files a query must read. Implemented in Python
 * (metrics_lake.spark.native_tables.Resolver, through py4j's callback server): delta-rs reads the Delta log.
 */
public interface SnapshotResolver {
    /**
     * The snapshot's files that may hold rows matching {@code predicatesJson}.
     *
     * @param table lake table name
     * @param version version to travel to, or "" for the latest
     * @param timestamp ISO time to travel to, or "" for the latest
     * @param predicatesJson JSON list of [column, operator, [[type, value], ...]] the files' rows must be
     *     able to match (pruning only: Spark applies its filters to the rows again)
     * @param scan true when a query's scan asks (the resolver may report files read of files in snapshot),
     *     false when a table is loaded
     * @return JSON {"version": n, "folder": the table's folder, "files": [[absolute path, size in bytes,
     *     modification time in ms], ...]}
     *     or {"error": "one line"}
     */
    String resolve(String table, String version, String timestamp, String predicatesJson, boolean scan);
}
