package metricslake.spark;

import java.net.InetSocketAddress;
import java.net.SocketAddress;

import org.apache.spark.connect.proto.ExecutePlanRequest;
import org.sparkproject.connect.grpc.ForwardingServerCallListener;
import org.sparkproject.connect.grpc.Grpc;
import org.sparkproject.connect.grpc.Metadata;
import org.sparkproject.connect.grpc.ServerCall;
import org.sparkproject.connect.grpc.ServerCallHandler;
import org.sparkproject.connect.grpc.ServerInterceptor;
import org.sparkproject.connect.grpc.Status;

/**
 * Spark Connect's gRPC interceptor ({@code spark.connect.grpc.interceptor.classes}) with the lake's tokens:
 * every call must carry {@code authorization: Bearer <token>}, what {@code sc://host:port/;token=...} sends.
 * Each call is checked, not only a session's first, so a revoked token's sessions end at their next
 * statement. Refused calls end with UNAUTHENTICATED (401), PERMISSION_DENIED (403) or RESOURCE_EXHAUSTED
 * (429) and one line; the service is never reached.
 *
 * <p>The first statement of a session binds the session to the token's name ({@link LakeAudit#bindSession}):
 * the audit records that name, and another token's statement in the same session is refused
 * (PERMISSION_DENIED) rather than run under the first token's name.
 */
public final class LakeConnectAuthInterceptor implements ServerInterceptor {
    private static final Metadata.Key<String> AUTHORIZATION =
            Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);

    @Override
    public <Q, R> ServerCall.Listener<Q> interceptCall(
            ServerCall<Q, R> call, Metadata headers, ServerCallHandler<Q, R> next) {
        String caller;
        try {
            caller = LakeAuth.check(bearer(headers.get(AUTHORIZATION)), null, source(call), "connect");
        } catch (LakeAuth.Denied denied) {
            Status status = switch (denied.status) {
                case 403 -> Status.PERMISSION_DENIED;
                case 429 -> Status.RESOURCE_EXHAUSTED;
                case 503 -> Status.UNAVAILABLE;
                default -> Status.UNAUTHENTICATED;
            };
            call.close(status.withDescription(denied.getMessage()), new Metadata());
            return new ServerCall.Listener<Q>() {
            };
        }
        return new ForwardingServerCallListener.SimpleForwardingServerCallListener<Q>(next.startCall(call, headers)) {
            private boolean refused;

            @Override
            public void onMessage(Q message) {
                if (message instanceof ExecutePlanRequest request
                        && !LakeAudit.bindSession(request.getSessionId(), caller)) {
                    refused = true;
                    call.close(Status.PERMISSION_DENIED.withDescription(
                            "this Spark Connect session belongs to another token; start a new session"),
                            new Metadata());
                    return;
                }
                if (!refused) {
                    super.onMessage(message);
                }
            }

            @Override
            public void onHalfClose() {
                if (!refused) {
                    super.onHalfClose();
                }
            }
        };
    }

    /** The token of an {@code authorization} header ({@code Bearer <token>}), the header itself otherwise. */
    private static String bearer(String header) {
        if (header == null || header.isBlank()) {
            return null;
        }
        String value = header.strip();
        return value.regionMatches(true, 0, "bearer ", 0, 7) ? value.substring(7).strip() : value;
    }

    private static String source(ServerCall<?, ?> call) {
        SocketAddress remote = call.getAttributes().get(Grpc.TRANSPORT_ATTR_REMOTE_ADDR);
        if (remote instanceof InetSocketAddress inet && inet.getAddress() != null) {
            return inet.getAddress().getHostAddress() + ":" + inet.getPort();
        }
        return "unknown";
    }
}
