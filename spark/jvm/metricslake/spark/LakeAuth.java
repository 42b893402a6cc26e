package metricslake.spark;

/**
 * The SQL endpoint's credential check, shared by its two listeners: Spark Connect's
 * {@link LakeConnectAuthInterceptor} and HiveServer2's {@link LakePasswdAuthenticationProvider}.
 *
 * <p>The lake's tokens (their records, hashes, expiry, revocation, the failure throttle) are
 * Python's: {@code lake sql-server} installs a {@link Checker} implemented in Python through py4j's
 * callback server (metrics_lake.spark.jobs.sql_server). Until one is installed every connection is refused.
 */
public final class LakeAuth {
    /** Answers whether a credential may read the lake. Implemented in Python. */
    public interface Checker {
        /**
         * Checks {@code credential} for a read.
         *
         * @param credential the token the client sent, or null when it sent none
         * @param user the user name a JDBC client logged in with (the token's name, or empty or
         *     {@code anonymous}), null for Spark Connect
         * @param source the client's address as {@code host:port} (what failures are counted against)
         * @param client {@code connect} or {@code jdbc}
         * @return {@code ok:<caller name>}, or {@code <status>:<one line>} with status 401 (no, wrong, expired
         *     or revoked token), 403 (the token may not read) or 429 (too many failures from the address)
         */
        String check(String credential, String user, String source, String client);

        /**
         * What {@code caller} (a token's name) may read: {@code admin}, {@code read}, or {@code read:<glob>} (the
         * rows of those servers only); null when it has no active token.
         */
        String scopeOf(String caller);
    }

    /** A refused credential: {@code status} as in {@link Checker#check}, the message safe to show the client. */
    public static final class Denied extends Exception {
        public final int status;

        Denied(int status, String message) {
            super(message);
            this.status = status;
        }
    }

    private static volatile Checker checker;

    private LakeAuth() {
    }

    /** Uses {@code newChecker} for every later connection (null: refuse them all). */
    public static void install(Checker newChecker) {
        checker = newChecker;
    }

    /**
     * What {@code caller} may read ({@link Checker#scopeOf}; {@link LakeRowScope}); null when it has no active
     * token, no checker is installed or the lookup fails (its statements are then refused).
     */
    public static String scopeOf(String caller) {
        Checker current = checker;
        if (current == null) {
            return null;
        }
        try {
            return current.scopeOf(caller);
        } catch (RuntimeException failure) {
            return null;
        }
    }

    /**
     * The caller's name if {@code credential} may read the lake.
     *
     * @throws Denied when it may not, or when the check itself failed (the client is told to see the log)
     */
    public static String check(String credential, String user, String source, String client) throws Denied {
        Checker current = checker;
        if (current == null) {
            throw new Denied(503, "the lake's SQL server is not accepting connections yet; retry in a few seconds");
        }
        String verdict;
        try {
            verdict = current.check(credential, user, source, client);
        } catch (RuntimeException failure) {
            throw new Denied(503, "the lake's SQL server could not check the token; its log says why");
        }
        if (verdict == null) {
            throw new Denied(503, "the lake's SQL server could not check the token; its log says why");
        }
        int colon = verdict.indexOf(':');
        String head = colon < 0 ? verdict : verdict.substring(0, colon);
        String rest = colon < 0 ? "" : verdict.substring(colon + 1);
        if (head.equals("ok")) {
            return rest;
        }
        int status;
        try {
            status = Integer.parseInt(head);
        } catch (NumberFormatException malformed) {
            status = 401;
        }
        throw new Denied(status, rest);
    }
}
