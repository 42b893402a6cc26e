package metricslake.spark;

import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import java.util.concurrent.atomic.AtomicReference;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * Warms the JVM's TLS code (JSSE) before {@code lake sql-server} takes its first client.
 *
 * <p>HiveServer2 serves TLS with JSSE's {@code SSLServerSocket}. Its first handshake after the JVM starts runs
 * the key exchange, the signature and the record cipher in the interpreter: measured on a 2-core machine, the
 * first handshake with a fresh server took 340 ms, the next ones 55, 23 and 12 ms, as the JIT compiled them.
 * Without a warm-up the first analyst to connect pays that. This runs TLS handshakes, each followed by a record
 * of application data both ways, between a client and a server socket of its own on a loopback port (nothing
 * reaches the server's listeners, its logs or its failed-login counters): the server side from the same key
 * store, key manager and protocol defaults HiveServer2 uses, the client side trusting that key store's
 * certificate.
 */
public final class LakeTlsWarmUp {
    private static final byte[] PING = "lake-sql-server warm-up".getBytes(StandardCharsets.US_ASCII);
    /** Milliseconds a warm-up connection may stay silent before it fails. */
    private static final int TIMEOUT_MS = 30_000;

    private LakeTlsWarmUp() {
    }

    /**
     * Runs {@code rounds} handshakes with the key in {@code keyStorePath}, over a loopback port of its own.
     *
     * @param keyStorePath a PKCS#12 key store holding the server's key and certificate chain
     * @param password the key store's password
     * @param rounds the handshakes to run
     * @return the nanoseconds of each connection (handshake and one record each way), in order
     * @throws IOException if the key store cannot be read, or a connection fails
     * @throws GeneralSecurityException if the key store holds no usable key
     */
    public static long[] handshakes(String keyStorePath, String password, int rounds)
            throws IOException, GeneralSecurityException {
        KeyStore store = LakeKeyStore.load(keyStorePath, password);
        KeyManagerFactory keys = LakeKeyStore.keyManagers(store, password);
        SSLContext server = SSLContext.getInstance("TLS");
        server.init(keys.getKeyManagers(), null, null);
        TrustManagerFactory trust = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        trust.init(store); // the key entry's certificate is a trust anchor: the client verifies it as a client would
        SSLContext client = SSLContext.getInstance("TLS");
        client.init(null, trust.getTrustManagers(), null);
        InetAddress loopback = InetAddress.getLoopbackAddress();
        long[] nanos = new long[rounds];
        try (ServerSocket listener = server.getServerSocketFactory().createServerSocket(0, rounds, loopback)) {
            listener.setSoTimeout(TIMEOUT_MS);
            AtomicReference<IOException> failed = new AtomicReference<>();
            Thread answering = new Thread(() -> {
                for (int i = 0; i < rounds; i++) {
                    try (Socket accepted = listener.accept()) {
                        accepted.setTcpNoDelay(true); // as Thrift's sockets are: no Nagle wait on the small records
                        accepted.setSoTimeout(TIMEOUT_MS);
                        accepted.getInputStream().readNBytes(PING.length);
                        accepted.getOutputStream().write(PING);
                    } catch (IOException e) {
                        failed.set(e);
                        return;
                    }
                }
            }, "lake-tls-warm-up");
            answering.setDaemon(true);
            answering.start();
            for (int i = 0; i < rounds; i++) {
                long started = System.nanoTime();
                try (Socket connection = client.getSocketFactory().createSocket(loopback, listener.getLocalPort())) {
                    connection.setTcpNoDelay(true);
                    connection.setSoTimeout(TIMEOUT_MS);
                    connection.getOutputStream().write(PING);
                    if (connection.getInputStream().readNBytes(PING.length).length != PING.length) {
                        throw new IOException("the TLS warm-up's server closed early", failed.get());
                    }
                }
                nanos[i] = System.nanoTime() - started;
            }
        }
        return nanos;
    }
}
