package metricslake.spark;

import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.execution.datasources.DataSourceStrategy$;
import org.apache.spark.sql.execution.datasources.FileStatusCache;
import org.apache.spark.sql.execution.datasources.FileStatusWithMetadata;
import org.apache.spark.sql.execution.datasources.InMemoryFileIndex;
import org.apache.spark.sql.execution.datasources.PartitionDirectory;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.IsNotNull;
import org.apache.spark.sql.sources.IsNull;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.types.StructType;

import scala.Option;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * The files of one Delta snapshot of a lake table, as Spark's file index: Spark's own Parquet scan reads them.
 *
 * <p>The {@link SnapshotResolver} (delta-rs, in the Python driver) names the snapshot's active files; they
 * reach Spark's {@link InMemoryFileIndex} through a file-status cache holding exactly those files, so Spark
 * lists no directory (a directory also holds files the snapshot removed and vacuum has not deleted yet),
 * infers partition values from the Hive-style paths delta-rs writes, typed by the table's schema, and
 * prunes partitions with the query's partition filters. {@link #listFiles} also asks the resolver, for the
 * same version, which files the filters' column-vs-literal comparisons can match by their Delta min/max
 * statistics, and keeps only those (Spark applies every filter to the rows again).
 */
final class LakeFileIndex extends InMemoryFileIndex {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final String table;
    private final long version;
    private final String folder;
    private final int filesInSnapshot;
    /** Listings by (partition filters, data filters): Spark lists a scan's files more than once while planning. */
    private final Map<List<Seq<Expression>>, Seq<PartitionDirectory>> listings = new ConcurrentHashMap<>();

    private LakeFileIndex(SparkSession session, String table, StructType schema, Snapshot snapshot) {
        super(session, CollectionConverters.asScala(snapshot.directories).toList(),
                scala.collection.immutable.Map.from(CollectionConverters.asScala(Map.of("basePath", snapshot.folder))),
                Option.apply(schema), snapshot.cache, Option.empty(), Option.empty());
        this.table = table;
        this.version = snapshot.version;
        this.folder = snapshot.folder;
        this.filesInSnapshot = snapshot.files;
    }

    /**
     * The snapshot of {@code table} at {@code version} or {@code timestamp}
     * ("" for the latest). Throws IllegalArgumentException with the resolver's one-line message (an unknown
     * or vacuumed version, a time before the table).
     */
    static LakeFileIndex open(SparkSession session, String table, String version, String timestamp,
            StructType schema) {
        JsonNode answer = ask(table, version, timestamp, "[]", false);
        ListedFiles cache = new ListedFiles();
        LinkedHashMap<Path, List<FileStatus>> byDirectory = new LinkedHashMap<>();
        for (JsonNode file : answer.get("files")) {
            Path path = new Path(file.get(0).asText());
            byDirectory.computeIfAbsent(path.getParent(), key -> new ArrayList<>()).add(
                    new FileStatus(file.get(1).asLong(), false, 1, 128L << 20, file.get(2).asLong(), path));
        }
        for (var entry : byDirectory.entrySet()) {
            cache.putLeafFiles(entry.getKey(), entry.getValue().toArray(new FileStatus[0]));
        }
        Snapshot snapshot = new Snapshot(answer.get("version").asLong(), answer.get("folder").asText(),
                new ArrayList<>(byDirectory.keySet()), cache, answer.get("files").size());
        return new LakeFileIndex(session, table, schema, snapshot);
    }

    @Override
    public Seq<PartitionDirectory> listFiles(Seq<Expression> partitionFilters, Seq<Expression> dataFilters) {
        return listings.computeIfAbsent(
                List.of(partitionFilters, dataFilters), key -> list(partitionFilters, dataFilters));
    }

    private Seq<PartitionDirectory> list(Seq<Expression> partitionFilters, Seq<Expression> dataFilters) {
        Seq<PartitionDirectory> listed = super.listFiles(partitionFilters, dataFilters);
        List<Expression> filters = new ArrayList<>(CollectionConverters.asJava(partitionFilters));
        filters.addAll(CollectionConverters.asJava(dataFilters));
        ArrayNode predicates = predicates(filters);
        // Asked even without predicates: the resolver prints the scan report (files read of files in the snapshot).
        JsonNode kept = ask(table, Long.toString(version), "", predicates.toString(), true);
        Set<String> keep = new HashSet<>();
        for (JsonNode file : kept.get("files")) {
            keep.add(new Path(file.get(0).asText()).toString());
        }
        List<PartitionDirectory> out = new ArrayList<>();
        int read = 0;
        for (PartitionDirectory directory : CollectionConverters.asJava(listed)) {
            List<FileStatusWithMetadata> files = new ArrayList<>();
            for (FileStatusWithMetadata file : CollectionConverters.asJava(directory.files())) {
                if (keep.contains(file.getPath().toString())) {
                    files.add(file);
                }
            }
            if (!files.isEmpty()) {
                out.add(new PartitionDirectory(directory.values(), CollectionConverters.asScala(files).toList()));
                read += files.size();
            }
        }
        LakeAudit.filesListed(read);
        return CollectionConverters.asScala(out).toList();
    }

    @Override
    public void refresh() {
        // A snapshot never changes; a newer one is a new index (every query loads its table anew).
    }

    /**
     * Same table folder and version. (InMemoryFileIndex compares root paths only, which two versions of a
     * table share: Spark would then reuse one version's scan for the other in the same query.)
     */
    @Override
    public boolean equals(Object other) {
        return other instanceof LakeFileIndex index && index.table.equals(table) && index.version == version
                && index.folder.equals(folder);
    }

    @Override
    public int hashCode() {
        return java.util.Objects.hash(table, version, folder);
    }

    @Override
    public String toString() {
        return "LakeFileIndex(" + table + " v" + version + ", " + filesInSnapshot + " files)";
    }

    private static JsonNode ask(String table, String version, String timestamp, String predicates, boolean scan) {
        JsonNode answer;
        try {
            answer = JSON.readTree(LakeSource.resolver().resolve(table, version, timestamp, predicates, scan));
        } catch (IOException error) {
            throw new IllegalStateException("lake table " + table + ": unreadable snapshot answer", error);
        }
        if (answer.has("error")) {
            throw new IllegalArgumentException(answer.get("error").asText());
        }
        return answer;
    }

    /** The filters that translate to a column compared with literals, as JSON [column, op, [[type, value]...]]. */
    private static ArrayNode predicates(List<Expression> filters) {
        ArrayNode out = JSON.createArrayNode();
        for (Expression expression : filters) {
            Option<Filter> translated = DataSourceStrategy$.MODULE$.translateFilter(expression, false);
            if (translated.isDefined()) {
                addPredicate(out, translated.get());
            }
        }
        return out;
    }

    private static void addPredicate(ArrayNode out, Filter filter) {
        String column;
        String op;
        Object[] values;
        if (filter instanceof EqualTo f) {
            column = f.attribute(); op = "="; values = new Object[] {f.value()};
        } else if (filter instanceof GreaterThan f) {
            column = f.attribute(); op = ">"; values = new Object[] {f.value()};
        } else if (filter instanceof GreaterThanOrEqual f) {
            column = f.attribute(); op = ">="; values = new Object[] {f.value()};
        } else if (filter instanceof LessThan f) {
            column = f.attribute(); op = "<"; values = new Object[] {f.value()};
        } else if (filter instanceof LessThanOrEqual f) {
            column = f.attribute(); op = "<="; values = new Object[] {f.value()};
        } else if (filter instanceof In f) {
            column = f.attribute(); op = "in"; values = f.values();
        } else if (filter instanceof IsNull f) {
            column = f.attribute(); op = "is_null"; values = new Object[0];
        } else if (filter instanceof IsNotNull f) {
            column = f.attribute(); op = "is_not_null"; values = new Object[0];
        } else {
            return;  // And, Or, Not, string matching: Spark applies them; files are not pruned by them
        }
        ArrayNode encoded = JSON.createArrayNode();
        for (Object value : values) {
            if (!addValue(encoded, value)) {
                return;
            }
        }
        out.add(JSON.createArrayNode().add(column).add(op).add(encoded));
    }

    /** Appends [type, value] for a literal the resolver can compare; false for any other. */
    private static boolean addValue(ArrayNode out, Object value) {
        ArrayNode typed = JSON.createArrayNode();
        if (value instanceof java.sql.Timestamp t) {
            value = t.toInstant();
        }
        if (value instanceof java.sql.Date d) {
            value = d.toLocalDate();
        }
        if (value instanceof String s) {
            typed.add("string").add(s);
        } else if (value instanceof Integer || value instanceof Long || value instanceof Short
                || value instanceof Byte) {
            typed.add("int").add(((Number) value).longValue());
        } else if (value instanceof Double || value instanceof Float) {
            typed.add("float").add(((Number) value).doubleValue());
        } else if (value instanceof Boolean b) {
            typed.add("bool").add(b);
        } else if (value instanceof java.time.LocalDate d) {
            typed.add("date").add(d.toString());
        } else if (value instanceof java.time.Instant t) {
            typed.add("timestamp_us").add(Math.addExact(Math.multiplyExact(t.getEpochSecond(), 1_000_000L),
                    t.getNano() / 1000));
        } else {
            return false;
        }
        out.add(typed);
        return true;
    }

    private record Snapshot(long version, String folder, List<Path> directories, ListedFiles cache, int files) {
    }

    /** A file-status cache holding exactly the snapshot's files per directory; Spark lists nothing itself. */
    private static final class ListedFiles extends FileStatusCache {
        private final HashMap<Path, FileStatus[]> files = new HashMap<>();

        @Override
        public Option<FileStatus[]> getLeafFiles(Path path) {
            return Option.apply(files.get(path));
        }

        @Override
        public void putLeafFiles(Path path, FileStatus[] leafFiles) {
            files.put(path, leafFiles);
        }

        @Override
        public void invalidateAll() {
            // The snapshot's files are all there is: nothing to forget.
        }
    }
}
