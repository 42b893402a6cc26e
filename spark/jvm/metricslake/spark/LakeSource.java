package metricslake.spark;

import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.sources.BaseRelation;
import org.apache.spark.sql.sources.SchemaRelationProvider;
import org.apache.spark.sql.types.StructType;

import scala.Option;
import scala.collection.immutable.Map;

/**
 * The provider of the lake's catalog tables: Spark's own Parquet scan over the files of a Delta snapshot
 * ({@link LakeFileIndex}), and the place the JVM finds the Python driver's {@link SnapshotResolver}.
 *
 * <p>Catalog tables use it as {@code CREATE TABLE t (columns) USING metricslake.spark.LakeSource OPTIONS
 * (table 't')}; {@link LakeCatalog} reads them (and travels in time).
 */
public final class LakeSource implements SchemaRelationProvider {
    private static volatile SnapshotResolver resolver;

    /** Set the resolver every lake relation of this JVM asks (the Python driver calls this once). */
    public static void setResolver(SnapshotResolver value) {
        resolver = value;
    }

    static SnapshotResolver resolver() {
        SnapshotResolver current = resolver;
        if (current == null) {
            throw new IllegalStateException("lake tables are read through metrics_lake's Spark session only");
        }
        return current;
    }

    /**
     * A relation with the table's columns and no way to read or write it: Spark asks for one when a catalog
     * entry is created (to check it). Sessions read lake tables through {@link LakeCatalog}; without it a
     * read fails instead of listing the table's folder, and no SQL can write to it.
     */
    @Override
    public BaseRelation createRelation(SQLContext context, Map<String, String> parameters, StructType schema) {
        if (option(parameters, "table").isEmpty()) {
            throw new IllegalArgumentException("lake tables need the option 'table'");
        }
        return new BaseRelation() {
            @Override
            public SQLContext sqlContext() {
                return context;
            }

            @Override
            public StructType schema() {
                return schema;
            }
        };
    }

    static String option(Map<String, String> parameters, String key) {
        Option<String> value = parameters.get(key);
        return value.isDefined() ? value.get() : "";
    }
}
