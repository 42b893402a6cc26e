package metricslake.spark;

import javax.security.sasl.AuthenticationException;

import org.apache.hive.service.auth.PasswdAuthenticationProvider;
import org.apache.hive.service.auth.TSetIpAddressProcessor;

/**
 * HiveServer2's {@code CUSTOM} authentication with the lake's tokens: the password is the token, the user
 * name is the token's name, or empty (which the Hive JDBC driver sends as {@code anonymous}). What beeline's
 * {@code -n/-p}, the Hive JDBC driver (DBeaver) and PyHive send. Both are checked by {@link LakeAuth}.
 */
public final class LakePasswdAuthenticationProvider implements PasswdAuthenticationProvider {
    @Override
    public void Authenticate(String user, String password) throws AuthenticationException {
        String address = TSetIpAddressProcessor.getUserIpAddress();
        String source = address == null ? "unknown" : address;
        try {
            LakeAuth.check(password == null || password.isEmpty() ? null : password, user, source, "jdbc");
        } catch (LakeAuth.Denied denied) {
            throw new AuthenticationException(denied.getMessage());
        }
    }
}
