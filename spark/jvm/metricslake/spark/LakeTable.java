package metricslake.spark;

import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Set;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.execution.datasources.v2.parquet.ParquetScanBuilder;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * One snapshot of a lake table as a read-only Spark (DataSource V2) table whose scan is Spark's own Parquet
 * scan over exactly the snapshot's files: column pruning, vectorised reading, partition pruning and
 * row-group skipping are Spark's. It supports no write: the lake's pipelines write its tables (exactly
 * once), never SQL. (It is deliberately not a FileTable, which Spark would fall back to a V1 file writer
 * for INSERT.)
 *
 * <p>A query's {@code WITH ('version' = '12')} or {@code WITH ('timestamp' = '...')} reads that snapshot
 * instead: the table options form of time travel.
 */
final class LakeTable implements SupportsRead {
    private final SparkSession session;
    private final String table;
    private final StructType declared;
    private final LakeFileIndex index;

    LakeTable(SparkSession session, String table, StructType declared, LakeFileIndex index) {
        this.session = session;
        this.table = table;
        this.declared = declared;
        this.index = index;
    }

    @Override
    public String name() {
        return table;
    }

    /** The declared columns, in their declared order (Spark derives {@code columns()} from it). */
    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
        return declared;
    }

    @Override
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.BATCH_READ);
    }

    @Override
    public ParquetScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        String version = options.getOrDefault("version", "");
        String timestamp = options.getOrDefault("timestamp", "");
        LakeFileIndex snapshot = version.isEmpty() && timestamp.isEmpty()
                ? index : LakeFileIndex.open(session, table, version, timestamp, declared);
        List<StructField> data = new ArrayList<>();
        for (StructField field : declared.fields()) {
            if (snapshot.partitionSchema().getFieldIndex(field.name()).isEmpty()) {
                data.add(field);
            }
        }
        return new ParquetScanBuilder(session, snapshot, declared, new StructType(data.toArray(new StructField[0])),
                options);
    }
}
