package metricslake.spark;

import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Pattern;

import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.CurrentUserContext;
import org.apache.spark.sql.catalyst.expressions.AttributeReference;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.RLike;
import org.apache.spark.sql.catalyst.plans.logical.Filter;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import org.apache.spark.sql.types.DataTypes;

import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractPartialFunction;

/**
 * What a token reads through the SQL endpoint, enforced in every plan its statements analyse: a read token created
 * with {@code --servers GLOB} sees only the rows of matching servers in every lake table that has a
 * {@code server} column; {@code sql_audit} (who ran which statement) is an admin token's only.
 *
 * <p>An analyzer rule (post-hoc resolution, injected by {@link LakeExtensions}) puts a filter
 * {@code server RLIKE <the glob as an anchored regex>} directly over every scan of such a table, views and temp
 * views included (their plans are analysed into the statement's), so no SQL reaches the unfiltered rows. (A
 * regex prunes no file: the filter runs on the rows the scan reads.) Tables without a {@code server} column are
 * read whole. A scan of {@code sql_audit} by a token that is not admin fails the statement, naming the table and
 * the token's scope.
 *
 * <p>The caller is the statement's: for Spark Connect the token its interceptor bound to the session (from the
 * operation's job tag), for JDBC the login name Spark's Thrift server sets for the statement
 * ({@code current_user()}), which {@link LakeAuth} accepted as the token's name. A plan analysed outside any
 * statement (the server's own warm-up, a Connect schema request, which returns no rows) is left alone. The
 * token's scope comes from {@link LakeAuth#scopeOf}, looked up again after {@link #CACHE_MS}; a token no longer
 * active has none, and its statements are refused: so a revoked token's open JDBC session ends at its next
 * statement, as a Connect session does at its interceptor.
 */
public final class LakeRowScope extends Rule<LogicalPlan> {
    /** How long a caller's scope is reused before it is looked up again (milliseconds). */
    static final long CACHE_MS = 2_000;
    /** The table only admin tokens read: the audit of who ran what. */
    static final String ADMIN_ONLY = "sql_audit";
    private static final Map<String, Object[]> SCOPES = new ConcurrentHashMap<>();

    @Override
    public LogicalPlan apply(LogicalPlan plan) {
        String caller = currentCaller();
        if (caller == null) {
            return plan;
        }
        String scope = scopeOf(caller);
        if (scope == null) {
            // Revoked or expired since it connected (a JDBC session is checked only when it opens), or the lookup
            // failed: the statement is refused rather than run with every row.
            throw new SecurityException("token '" + caller + "' is revoked or expired (no longer active), or its "
                    + "scope could not be looked up: this statement is refused; connect again with an active token");
        }
        if (scope.equals("admin")) {
            return plan;
        }
        String regex = scope.startsWith("read:") ? globRegex(scope.substring("read:".length())) : null;
        return (LogicalPlan) plan.transformUp(new AbstractPartialFunction<LogicalPlan, LogicalPlan>() {
            @Override
            public boolean isDefinedAt(LogicalPlan node) {
                return lakeTable(node) != null;
            }

            @Override
            public LogicalPlan apply(LogicalPlan node) {
                DataSourceV2Relation relation = lakeTable(node);
                if (ADMIN_ONLY.equals(relation.table().name())) {
                    throw new SecurityException("table " + ADMIN_ONLY + " (who ran which statement) is an admin "
                            + "token's only; token '" + caller + "' has scope " + scope);
                }
                AttributeReference server = serverColumn(relation);
                if (regex == null || server == null) {
                    return node;
                }
                return new Filter(new RLike(server, Literal.create(regex, DataTypes.StringType)), node);
            }
        });
    }

    /**
     * A glob of server names ({@code *} any characters, {@code ?} one, every other character itself: what
     * {@code lake tokens create --servers} accepts for read tokens) as a regex matching whole names only.
     */
    public static String globRegex(String glob) {
        StringBuilder out = new StringBuilder("^(?s:");
        StringBuilder literal = new StringBuilder();
        for (char c : glob.toCharArray()) {
            if (c == '*' || c == '?') {
                if (literal.length() > 0) {
                    out.append(Pattern.quote(literal.toString()));
                    literal.setLength(0);
                }
                out.append(c == '*' ? ".*" : ".");
            } else {
                literal.append(c);
            }
        }
        if (literal.length() > 0) {
            out.append(Pattern.quote(literal.toString()));
        }
        return out.append(")\\z").toString();
    }

    /** A lake table's scan, or null for any other node. */
    private static DataSourceV2Relation lakeTable(LogicalPlan node) {
        return node instanceof DataSourceV2Relation relation && relation.table() instanceof LakeTable
                ? relation : null;
    }

    /** The {@code server} column of a lake table's scan, or null. */
    private static AttributeReference serverColumn(DataSourceV2Relation relation) {
        for (AttributeReference column : CollectionConverters.asJava(relation.output())) {
            if (column.name().equalsIgnoreCase("server")) {
                return column;
            }
        }
        return null;
    }

    /** Who the statement analysing on this thread runs for (class docstring), or null outside a statement. */
    private static String currentCaller() {
        SparkSession session = SparkSession.getActiveSession().getOrElse(() -> null);
        if (session != null) {
            String sessionId = LakeAudit.connectSession(session.sparkContext());
            if (sessionId != null) {
                String caller = LakeAudit.callerOf(sessionId);
                if (caller == null) {  // the interceptor binds every session before its first statement
                    throw new IllegalStateException("this Spark Connect session has no token; reconnect");
                }
                return caller;
            }
        }
        String user = CurrentUserContext.CURRENT_USER().get();
        return user == null || user.isEmpty() ? null : user;
    }

    /** {@link LakeAuth#scopeOf}, remembered for {@link #CACHE_MS} (a null answer is not remembered). */
    private static String scopeOf(String caller) {
        long now = System.currentTimeMillis();
        Object[] cached = SCOPES.get(caller);
        if (cached != null && now - (Long) cached[1] < CACHE_MS) {
            return (String) cached[0];
        }
        String scope = LakeAuth.scopeOf(caller);
        if (scope != null) {
            SCOPES.put(caller, new Object[] {scope, now});
        }
        return scope;
    }
}
