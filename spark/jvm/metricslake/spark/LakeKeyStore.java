package metricslake.spark;

import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.security.GeneralSecurityException;
import java.security.KeyStore;
import javax.net.ssl.KeyManagerFactory;

/**
 * The PKCS#12 key store {@code lake sql-server} writes from its PEM certificate and key
 * ({@code metrics_lake.spark.sql_server_tls.write_keystore}), read for the TLS listeners of the driver's JVM.
 */
final class LakeKeyStore {
    private LakeKeyStore() {
    }

    /**
     * Reads the key store at {@code path}.
     *
     * @throws IOException if it cannot be read, or {@code password} is wrong
     * @throws GeneralSecurityException if it is not a PKCS#12 key store
     */
    static KeyStore load(String path, String password) throws IOException, GeneralSecurityException {
        KeyStore store = KeyStore.getInstance("PKCS12");
        try (InputStream in = new FileInputStream(path)) {
            store.load(in, password.toCharArray());
        }
        return store;
    }

    /**
     * The key managers of {@code store} (the JDK's default algorithm, as HiveServer2's own TLS uses).
     *
     * @throws GeneralSecurityException if the store holds no usable key
     */
    static KeyManagerFactory keyManagers(KeyStore store, String password) throws GeneralSecurityException {
        KeyManagerFactory keys = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
        keys.init(store, password.toCharArray());
        return keys;
    }
}
