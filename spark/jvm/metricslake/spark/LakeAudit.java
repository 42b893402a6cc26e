package metricslake.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import org.apache.spark.SparkContext;
import org.apache.spark.connect.proto.Plan;
import org.apache.spark.connect.proto.SqlCommand;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerEvent;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.connect.service.SparkListenerConnectOperationCanceled;
import org.apache.spark.sql.connect.service.SparkListenerConnectOperationClosed;
import org.apache.spark.sql.connect.service.SparkListenerConnectOperationFailed;
import org.apache.spark.sql.connect.service.SparkListenerConnectOperationFinished;
import org.apache.spark.sql.connect.service.SparkListenerConnectOperationStarted;
import org.apache.spark.sql.connect.service.SparkListenerConnectSessionClosed;
import org.apache.spark.sql.hive.thriftserver.ui.SparkListenerThriftServerOperationCanceled;
import org.apache.spark.sql.hive.thriftserver.ui.SparkListenerThriftServerOperationClosed;
import org.apache.spark.sql.hive.thriftserver.ui.SparkListenerThriftServerOperationError;
import org.apache.spark.sql.hive.thriftserver.ui.SparkListenerThriftServerOperationFinish;
import org.apache.spark.sql.hive.thriftserver.ui.SparkListenerThriftServerOperationStart;

import scala.jdk.javaapi.CollectionConverters;

/**
 * The SQL endpoint's audit: every statement a Spark Connect or JDBC client runs, once, as a JSON record that
 * {@code lake sql-server} drains ({@link #drain}) into the {@code sql_audit} table.
 *
 * <p>Registered as a Spark listener ({@code spark.extraListeners}), it follows the operation events both
 * servers post on Spark's listener bus: Spark Connect's {@code SparkListenerConnectOperation*} and the Thrift
 * server's {@code SparkListenerThriftServerOperation*}. A statement's record is made at its first terminal
 * event: finished ({@code ok}), failed ({@code error}, with the message), canceled, or closed before any of
 * these ({@code closed}: the client went away); later events of the same statement are ignored, so no
 * statement is recorded twice.
 *
 * <p>What ran: the SQL text where there is one (JDBC's statement; Spark Connect's SQL relation or command),
 * else Spark Connect's plan as text; {@code kind} says whether a Connect request was a {@code query} (a plan run
 * for its rows) or a {@code command} ({@code spark.sql} sends its SQL as a command first: a query is only
 * analysed then, and runs as the {@code query} that follows); JDBC requests are {@code statement}s.
 *
 * <p>Who ran it: for JDBC the session's login name, which {@link LakeAuth} accepted as the token's name; for
 * Spark Connect the token's name its interceptor bound to the session ({@link #bindSession}), never the user
 * name the client claims. Files read: the files the lake tables' scans listed for the statement
 * ({@link #filesListed}, counted by the statement's job group or Connect job tag), after partition and
 * statistics pruning. Rows: what Spark Connect reports as produced; the Thrift server reports none (null).
 */
public final class LakeAudit extends SparkListener {
    private static final ObjectMapper JSON = new ObjectMapper();
    /** Statements the drain has not taken yet, at most this many (beyond, the oldest are counted as dropped). */
    private static final int MAX_PENDING = 100_000;
    /** The longest statement text recorded, in characters. */
    static final int MAX_STATEMENT_CHARS = 65_536;

    /** The local property holding a thread's job group: the Thrift server sets it to the statement's id. */
    private static final String JOB_GROUP = "spark.jobGroup.id";
    /** How a Spark Connect operation's job tag begins (the {@code jobTag} of its events). */
    private static final String CONNECT_TAG = "SparkConnect_OperationTag_";

    private static final Map<String, ObjectNode> RUNNING = new ConcurrentHashMap<>();
    private static final ConcurrentLinkedQueue<String> FINISHED = new ConcurrentLinkedQueue<>();
    private static final Map<String, String> CONNECT_SESSIONS = new ConcurrentHashMap<>();
    private static final Map<String, Long> FILES = new ConcurrentHashMap<>();
    private static volatile long dropped;

    /**
     * Binds a Spark Connect session to the token that opened it. Returns false (binding nothing) when the
     * session is already bound to another caller: a token may not run statements in another token's session.
     */
    public static boolean bindSession(String sessionId, String caller) {
        String bound = CONNECT_SESSIONS.putIfAbsent(sessionId, caller);
        return bound == null || bound.equals(caller);
    }

    /** The token's name a Spark Connect session is bound to ({@link #bindSession}), or null. */
    static String callerOf(String sessionId) {
        return CONNECT_SESSIONS.get(sessionId);
    }

    /**
     * The Spark Connect session of the operation running on this thread, from its job tag
     * ({@code SparkConnect_OperationTag_User_<user>_Session_<session>_Operation_<operation>}); null outside one.
     */
    static String connectSession(SparkContext context) {
        String tag = connectTag(context);
        int session = tag == null ? -1 : tag.indexOf("_Session_");
        int operation = session < 0 ? -1 : tag.indexOf("_Operation_", session);
        return operation < 0 ? null : tag.substring(session + "_Session_".length(), operation);
    }

    /** The job tag of the Spark Connect operation running on this thread (its events' {@code jobTag}), or null. */
    private static String connectTag(SparkContext context) {
        for (String tag : CollectionConverters.asJava(context.getJobTags())) {
            int at = tag.indexOf(CONNECT_TAG);  // Spark may prefix a session's tags with its own id
            if (at >= 0) {
                return tag.substring(at);
            }
        }
        return null;
    }

    /** Counts {@code files} read by the statement planning on this thread (its job group or Connect tag). */
    static void filesListed(int files) {
        String key = statementKey();
        if (key != null) {
            FILES.merge(key, (long) files, Long::sum);
        }
    }

    /** Up to {@code max} finished statements' JSON records, oldest first, removed from the queue. */
    public static List<String> drain(int max) {
        List<String> out = new ArrayList<>();
        String record;
        while (out.size() < max && (record = FINISHED.poll()) != null) {
            out.add(record);
        }
        return out;
    }

    /** Statements dropped because the queue was full (the drain fell behind by {@link #MAX_PENDING}). */
    public static long dropped() {
        return dropped;
    }

    @Override
    @SuppressWarnings("deprecation")  // SqlCommand.getSql: what clients before Spark 3.5 send
    public void onOtherEvent(SparkListenerEvent event) {
        if (event instanceof SparkListenerConnectOperationStarted e) {
            String caller = CONNECT_SESSIONS.getOrDefault(e.sessionId(), "unknown");
            String kind = "query";
            String text = e.statementText();
            if (e.planRequest().isDefined()) {
                Plan plan = e.planRequest().get().getPlan();
                if (plan.hasCommand()) {
                    kind = "command";
                    if (plan.getCommand().hasSqlCommand()) {
                        SqlCommand sql = plan.getCommand().getSqlCommand();
                        text = sql.hasInput() && sql.getInput().hasSql() ? sql.getInput().getSql().getQuery()
                                : sql.getSql();
                    }
                } else if (plan.hasRoot() && plan.getRoot().hasSql()) {
                    text = plan.getRoot().getSql().getQuery();
                }
            }
            start(e.jobTag(), "connect", kind, e.operationId(), e.sessionId(), caller, text, e.eventTime());
        } else if (event instanceof SparkListenerConnectOperationFinished e) {
            Object rows = e.producedRowCount().isDefined() ? e.producedRowCount().get() : null;
            finish(e.jobTag(), "ok", null, e.eventTime(), rows instanceof Long n ? n : null);
        } else if (event instanceof SparkListenerConnectOperationFailed e) {
            finish(e.jobTag(), "error", e.errorMessage(), e.eventTime(), null);
        } else if (event instanceof SparkListenerConnectOperationCanceled e) {
            finish(e.jobTag(), "canceled", null, e.eventTime(), null);
        } else if (event instanceof SparkListenerConnectOperationClosed e) {
            finish(e.jobTag(), "closed", null, e.eventTime(), null);
        } else if (event instanceof SparkListenerConnectSessionClosed e) {
            CONNECT_SESSIONS.remove(e.sessionId());  // a closed session's id is not used again
        } else if (event instanceof SparkListenerThriftServerOperationStart e) {
            start(e.id(), "jdbc", "statement", e.id(), e.sessionId(), e.userName(), e.statement(), e.startTime());
        } else if (event instanceof SparkListenerThriftServerOperationFinish e) {
            finish(e.id(), "ok", null, e.finishTime(), null);
        } else if (event instanceof SparkListenerThriftServerOperationError e) {
            finish(e.id(), "error", e.errorMsg(), e.finishTime(), null);
        } else if (event instanceof SparkListenerThriftServerOperationCanceled e) {
            finish(e.id(), "canceled", null, e.finishTime(), null);
        } else if (event instanceof SparkListenerThriftServerOperationClosed e) {
            finish(e.id(), "closed", null, e.closeTime(), null);
        }
    }

    private static void start(String key, String client, String kind, String id, String session, String caller,
            String text, long startMs) {
        ObjectNode record = JSON.createObjectNode();
        record.put("statement_id", id);
        record.put("session_id", session);
        record.put("client", client);
        record.put("kind", kind);
        record.put("caller", caller == null || caller.isEmpty() ? "anonymous" : caller);
        String statement = text == null ? "" : text;
        record.put("statement", statement.length() > MAX_STATEMENT_CHARS
                ? statement.substring(0, MAX_STATEMENT_CHARS) : statement);
        record.put("started_ms", startMs);
        RUNNING.put(key, record);
    }

    private static void finish(String key, String outcome, String error, long endMs, Long rows) {
        ObjectNode record = RUNNING.remove(key);
        Long files = FILES.remove(key);  // its scans are planned: nothing lists files for it after its end
        if (record == null) {
            return;  // already recorded at an earlier terminal event, or started before this listener
        }
        record.put("duration_ms", Math.max(0L, endMs - record.get("started_ms").asLong()));
        record.put("outcome", outcome);
        if (error != null) {
            record.put("error", error.length() > MAX_STATEMENT_CHARS ? error.substring(0, MAX_STATEMENT_CHARS) : error);
        }
        if (rows != null) {
            record.put("rows", rows);
        }
        record.put("files", files == null ? 0L : files);
        if (FINISHED.size() >= MAX_PENDING) {
            FINISHED.poll();
            dropped++;
        }
        FINISHED.add(record.toString());
    }

    /**
     * What identifies the statement planning on this thread: the Thrift server's job group (its statement id),
     * or the Connect operation's job tag; null for anything else (the server's own warm-up).
     */
    private static String statementKey() {
        SparkSession session = SparkSession.getActiveSession().getOrElse(() -> null);
        if (session == null) {
            return null;
        }
        SparkContext context = session.sparkContext();
        String tag = connectTag(context);
        if (tag != null) {
            return tag;
        }
        return context.getLocalProperty(JOB_GROUP);
    }
}
