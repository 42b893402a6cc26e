package metricslake.spark;

import java.time.Instant;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.analysis.NoSuchTableException;
import org.apache.spark.sql.catalyst.catalog.CatalogTable;
import org.apache.spark.sql.connector.catalog.DelegatingCatalogExtension;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.V1Table;

/**
 * Spark's session catalog ({@code spark.sql.catalog.spark_catalog}) with the lake's tables read natively.
 *
 * <p>Lake tables are ordinary catalog entries whose provider is {@link LakeSource} (so {@code SHOW TABLES},
 * JDBC metadata and joins see them as any table); loading one returns a {@link LakeTable} over the files of
 * its Delta snapshot, resolved each time a query is analysed. {@code VERSION AS OF n} and
 * {@code TIMESTAMP AS OF '...'} load an older snapshot, as Delta-Spark's catalog does. Every other table
 * is the session catalog's own.
 */
public final class LakeCatalog extends DelegatingCatalogExtension {
    @Override
    public Table loadTable(Identifier ident) throws NoSuchTableException {
        return lake(super.loadTable(ident), "", "");
    }

    @Override
    public Table loadTable(Identifier ident, String version) throws NoSuchTableException {
        Table table = super.loadTable(ident);
        return isLake(table) ? lake(table, version, "") : super.loadTable(ident, version);
    }

    @Override
    public Table loadTable(Identifier ident, long timestamp) throws NoSuchTableException {
        Table table = super.loadTable(ident);
        if (!isLake(table)) {
            return super.loadTable(ident, timestamp);
        }
        // Spark passes microseconds since the epoch, the query's time zone already applied.
        Instant at = Instant.ofEpochSecond(Math.floorDiv(timestamp, 1_000_000L),
                Math.floorMod(timestamp, 1_000_000L) * 1000L);
        return lake(table, "", at.toString());
    }

    private static boolean isLake(Table table) {
        return table instanceof V1Table v1 && LakeSource.class.getName().equals(
                v1.catalogTable().provider().getOrElse(() -> ""));
    }

    private static Table lake(Table table, String version, String timestamp) {
        if (!isLake(table)) {
            return table;
        }
        CatalogTable entry = ((V1Table) table).catalogTable();
        String name = LakeSource.option(entry.storage().properties(), "table");
        SparkSession session = SparkSession.active();
        return new LakeTable(session, name, entry.schema(),
                LakeFileIndex.open(session, name, version, timestamp, entry.schema()));
    }
}
