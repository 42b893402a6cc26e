"""The SQL server's credential check as its JVM listeners see it (``LakeAuth.Checker``): verdict strings for
each kind of token, failures throttled per address, and none for an unknown address (a JDBC login)."""

from __future__ import annotations

import pytest

from metrics_lake.app.auth import Authenticator
from metrics_lake.core.config import LakeSettings
from metrics_lake.core.storage import LocalStore
from metrics_lake.core.tokens import Scope, TokenStore, parse_token
from metrics_lake.lake_schemas.errors import TokenError
from metrics_lake.spark.jobs.sql_server import CredentialChecker


def test_verdicts_for_each_token_and_throttling_only_where_the_address_is_known(tmp_path, caplog):
    store = LocalStore(tmp_path / "lake")
    tokens = TokenStore(store)
    read, _ = tokens.create("ana", Scope.READ)
    write, _ = tokens.create("agents", Scope.WRITE)
    admin, _ = tokens.create("ops", Scope.ADMIN)
    auth = Authenticator(LakeSettings(root=str(tmp_path / "lake")), store, refresh_seconds=3600)
    try:
        auth.failures.clock = lambda: 100.0  # no refill during the test
        checker = CredentialChecker(
            lambda credential, address: auth.authenticate_blocking(credential, address, Scope.READ).name
        )
        assert checker.check(read, None, "10.0.0.5:41000", "connect") == "ok:ana"
        assert checker.check(read, None, "10.0.0.5:41001", "connect") == "ok:ana"  # verified once, then remembered
        assert checker.check(admin, "ops", "unknown", "jdbc") == "ok:ops"
        # A JDBC login's user name is the token's (its statements are audited under it): not another, not none
        # (empty, or the JDBC driver's "anonymous" for none).
        for user in ("bob", "", "anonymous"):
            assert checker.check(admin, user, "unknown", "jdbc") == "401:the user name must be the token's name (ops)"
        assert (
            checker.check(write, None, "10.0.0.5:41002", "connect")
            == "403:token 'agents' has scope write; this needs read"
        )
        assert checker.check(None, None, "10.0.0.5:41003", "connect").startswith("401:a token is required")
        tokens.revoke("ana")
        auth.refresh()
        assert checker.check(read, None, "10.0.0.6:1", "connect") == "401:token 'ana' is revoked; ask for a new one"

        # 20 failures from one address, then 429 for it (whatever it sends); the JDBC logins' unknown address
        # throttles no one.
        bad = read[:-4] + "AAAA"
        verdicts = [checker.check(bad, None, "10.0.0.7:5000", "connect") for _ in range(25)]
        assert all(v.startswith("401:") for v in verdicts[:19]) and verdicts[-1].startswith("429:too many failed")
        assert checker.check(admin, None, "10.0.0.7:5001", "connect").startswith("429:")
        assert all(checker.check(bad, "ana", "unknown", "jdbc").startswith("401:") for _ in range(25))
        assert checker.check(admin, "ops", "unknown", "jdbc") == "ok:ops"
    finally:
        auth.close()
    logged = caplog.text
    assert (
        "refused a jdbc client from an unknown address" in logged and "refused a connect client from 10.0.0.7" in logged
    )
    assert parse_token(read)[1] not in logged and parse_token(bad)[1] not in logged


def test_a_failing_check_is_an_answer_not_an_exception():
    def broken(credential, address):
        raise OSError("store unreachable")

    assert CredentialChecker(broken).check("x", None, "1.2.3.4:5", "connect").startswith("503:the token check failed")


def test_the_sql_server_knows_each_token_s_scope_and_other_doors_refuse_a_read_token_limited_to_servers(tmp_path):
    store = LocalStore(tmp_path / "lake")
    tokens = TokenStore(store)
    web, _ = tokens.create("web", Scope.READ, servers="web-*")
    read, _ = tokens.create("ana", Scope.READ)
    admin, _ = tokens.create("ops", Scope.ADMIN)
    settings = LakeSettings(root=str(tmp_path / "lake"))
    sql = Authenticator(settings, store, refresh_seconds=3600, row_scope=True)
    door = Authenticator(settings, store, refresh_seconds=3600)  # the dashboard's, remote-read's
    try:
        assert sql.authenticate_blocking(web, None, Scope.READ).name == "web"
        checker = CredentialChecker(lambda c, a: sql.authenticate_blocking(c, a, Scope.READ).name, sql.scope_of)
        assert [checker.scopeOf(n) for n in ("web", "ana", "ops", "nobody")] == ["read:web-*", "read", "admin", None]
        with pytest.raises(TokenError, match="reads only servers web-\\*; only the SQL endpoint") as refused:
            door.authenticate_blocking(web, "10.0.0.5", Scope.READ)
        assert refused.value.status == 403
        assert door.authenticate_blocking(read, "10.0.0.5", Scope.READ).name == "ana"
        tokens.revoke("web")
        sql.refresh()
        assert checker.scopeOf("web") is None  # no longer a token: its statements are refused
        assert door.authenticate_blocking(admin, None, Scope.READ).name == "ops"
    finally:
        sql.close()
        door.close()

    def broken(caller):
        raise OSError("store unreachable")

    assert CredentialChecker(lambda c, a: "x", broken).scopeOf("web") is None  # refused, never all rows
