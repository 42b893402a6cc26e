package metricslake.spark;

import io.netty.handler.ssl.SslContextBuilder;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import javax.net.ssl.KeyManagerFactory;
import org.apache.spark.SparkEnv;
import org.apache.spark.sql.connect.service.SparkConnectInterceptorRegistry;
import org.apache.spark.sql.connect.service.SparkConnectService;
import org.sparkproject.connect.grpc.Server;
import org.sparkproject.connect.grpc.netty.GrpcSslContexts;
import org.sparkproject.connect.grpc.netty.NettyServerBuilder;

/**
 * Spark Connect over TLS, served by the driver's own gRPC (Netty) server.
 *
 * <p>Spark's Connect plugin starts a plain-text gRPC server only. {@code lake sql-server --tls-cert/--tls-key}
 * binds that one to a loopback port and starts this second server on the public address: the same Connect
 * service (its sessions, operations and listeners are the plugin's, shared through {@code SparkConnectService}'s
 * singletons), the interceptors of {@code spark.connect.grpc.interceptor.classes} (the lake's token check,
 * {@link LakeConnectAuthInterceptor}), and TLS with ALPN {@code h2} as gRPC clients require
 * ({@code GrpcSslContexts}). It is what Spark's own {@code SparkConnectService.startGRPCService} builds, plus
 * {@code sslContext}: the bytes of a statement's answer are encrypted where they are produced, not relayed
 * through another process, and the token check sees each client's own address.
 */
public final class LakeConnectTls {
    /** Spark Connect's default largest request (bytes), {@code spark.connect.grpc.maxInboundMessageSize}. */
    private static final String DEFAULT_MAX_INBOUND = "128m";

    private LakeConnectTls() {
    }

    /**
     * Starts serving Connect over TLS on {@code host:port}; returns the running server (stop it with
     * {@code shutdownNow()}).
     *
     * @param keyStorePath a PKCS#12 key store holding the server's key and certificate chain (the one HiveServer2
     *     serves TLS from)
     * @param password the key store's password
     * @throws IOException if the port cannot be bound or the key store read
     * @throws GeneralSecurityException if the key store does not hold a usable key
     */
    public static Server start(String host, int port, String keyStorePath, String password)
            throws IOException, GeneralSecurityException {
        KeyStore store = LakeKeyStore.load(keyStorePath, password);
        KeyManagerFactory keys = LakeKeyStore.keyManagers(store, password);
        long maxInbound = SparkEnv.get().conf()
                .getSizeAsBytes("spark.connect.grpc.maxInboundMessageSize", DEFAULT_MAX_INBOUND);
        NettyServerBuilder builder = NettyServerBuilder.forAddress(new InetSocketAddress(host, port))
                .sslContext(GrpcSslContexts.configure(SslContextBuilder.forServer(keys)).build())
                .maxInboundMessageSize((int) Math.min(maxInbound, Integer.MAX_VALUE))
                .addService(new SparkConnectService(false));
        SparkConnectInterceptorRegistry.chainInterceptors(builder);
        return builder.build().start();
    }
}
