"""SASL for Kafka clients (KIP-43, KIP-152) and Kafka's SCRAM credential admin (KIP-554).

On a SASL_PLAINTEXT or SASL_SSL listener a connection starts unauthenticated: it may send
ApiVersions, then SaslHandshake v1 (the mechanism; answered with the enabled ones and
UNSUPPORTED_SASL_MECHANISM when it is not among them), then SaslAuthenticate v0-2 carrying
the mechanism's tokens (PLAIN: one; SCRAM: two). Any other api before success closes the
connection, as Kafka does (the listener checks ``conn.authenticated``). Success sets
``conn.principal`` to ``User:<name>``. SaslHandshake v0, after which Kafka reads raw SASL
tokens without Kafka's framing, is advertised (librdkafka 2.0.2 turns SASL off unless the
range starts at 0) but closes the connection: every client this project tests (librdkafka,
kafka-python, aiokafka, Java) picks v1 from ApiVersions.

``session_lifetime_ms`` (v1+) is 0, Kafka's answer when ``connections.max.reauth.ms`` is 0
(its default): the session never expires and no re-authentication is asked for. A second
handshake on an authenticated connection, or SASL on a listener without it, answers
ILLEGAL_SASL_STATE as Kafka does.

A failed attempt answers SASL_AUTHENTICATION_FAILED (58) after a delay, parked on the loop
like a Fetch's long poll (no thread sleeps): ``FailureDelays`` doubles it per failure from
the same host, 100 ms (Kafka's connection.failed.authentication.delay.ms) to 5 s, forgotten
after 10 minutes without one; the connection is then closed by its next request. Each
failure is logged once, with the client's address and the user it named.

Describe- and AlterUserScramCredentials need Cluster Describe and Alter (Kafka's rule, through
the ``Authorizer``), and answer CLUSTER_AUTHORIZATION_FAILED to User:ANONYMOUS whatever the
ACLs say (a client of a PLAINTEXT listener): whoever can reach a loopback port must not be
able to create the users that open a SASL listener on another interface. The first user comes
from ``mq users add``, over the Unix socket.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping, Sequence

from mq import errors
from mq.broker.acls import ANONYMOUS, OPEN, AclOperation, Authorizer, ResourceType
from mq.broker.apis.users import UserApis
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.exchange import CloseConnection, Park
from mq.errors import (
    IllegalSaslStateError,
    RemoteProtocolError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)
from mq.protocol.kafka.sasl import (
    MECHANISM_IDS,
    SCRAM_MECHANISMS,
    ScramServer,
    check_plain,
    parse_plain,
)

__all__ = ["FailureDelays", "SaslWireApis"]

log = logging.getLogger("mq.broker")

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
PRE_AUTH_APIS = frozenset({18, SASL_HANDSHAKE, SASL_AUTHENTICATE})   # 18: ApiVersions
_FAILED = "failed"
_ANONYMOUS_ADMIN = ("SCRAM credentials need Cluster Alter/Describe and an authenticated user "
                    "(or mq users over the Unix socket)")
_MECHANISM_NAMES = {v: k for k, v in MECHANISM_IDS.items()}


class FailureDelays:
    """How long to hold a failed authentication's answer, per client host (pure: time in)."""

    def __init__(self, first_s: float = 0.1, max_s: float = 5.0, forget_s: float = 600.0,
                 max_hosts: int = 10_000) -> None:
        self.first_s, self.max_s, self.forget_s = first_s, max_s, forget_s
        self._max_hosts = max_hosts
        self._hosts: collections.OrderedDict[str, tuple[int, float]] = \
            collections.OrderedDict()

    def failed(self, host: str, now: float) -> float:
        """Count a failure from ``host``; the delay to apply to it (seconds)."""
        count, last = self._hosts.pop(host, (0, now))
        if now - last > self.forget_s:
            count = 0
        count += 1
        self._hosts[host] = (count, now)
        while len(self._hosts) > self._max_hosts:      # a flood of hosts: forget the oldest
            self._hosts.popitem(last=False)
        return min(self.first_s * 2 ** (count - 1), self.max_s)


class SaslWireApis:
    def __init__(self, users: UserApis, mechanisms: Sequence[str], authz: Authorizer = OPEN,
                 delays: FailureDelays | None = None) -> None:
        self._users = users
        self._authz = authz
        self._mechanisms = list(mechanisms)
        self._delays = delays or FailureDelays()

    def handlers(self) -> Mapping[int, object]:
        return {SASL_HANDSHAKE: self.handshake, SASL_AUTHENTICATE: self.authenticate,
                50: self.describe_scram, 51: self.alter_scram}

    # --- SASL ---------------------------------------------------------------------------------
    def handshake(self, conn: KafkaConn, version: int, body: dict) -> dict:
        """Raises ``RemoteProtocolError`` (the listener closes the connection) after a failed
        attempt, and for v0."""
        if conn.sasl == _FAILED:
            raise RemoteProtocolError("SaslHandshake after a failed authentication")
        if version == 0:
            raise RemoteProtocolError("SaslHandshake v0 (raw SASL tokens, before KIP-152) is "
                                      "not served; the client must use v1")
        if conn.authenticated:         # a PLAINTEXT/SSL listener, or done already
            return {"error_code": IllegalSaslStateError.code, "mechanisms": self._mechanisms}
        mechanism = body["mechanism"]
        if mechanism not in self._mechanisms:
            log.info("Kafka client %s asked for SASL mechanism %.40r; enabled: %s", conn.peer,
                     mechanism, ", ".join(self._mechanisms))
            return {"error_code": UnsupportedSaslMechanismError.code,
                    "mechanisms": self._mechanisms}
        conn.sasl = mechanism if mechanism == "PLAIN" else ScramServer(
            mechanism, lambda user: self._users.credential(user, mechanism))
        return {"error_code": 0, "mechanisms": self._mechanisms}

    def authenticate(self, conn: KafkaConn, version: int, body: dict):
        state = conn.sasl
        if state == _FAILED:
            return CloseConnection("SaslAuthenticate after a failed authentication")
        if conn.authenticated or state is None:
            return _auth_answer(IllegalSaslStateError.code,
                                "SaslAuthenticate without a SaslHandshake first" if not
                                conn.authenticated else "already authenticated")
        token = bytes(body["auth_bytes"])
        user = "?"
        try:
            if state == "PLAIN":
                _, user, password = parse_plain(token)
                mechanism, cred = self._plain_verifier(user)
                check_plain(mechanism, cred, password)
                return self._success(conn, user, b"")
            if state.expects_first:
                return _auth_answer(0, None, state.client_first(token))
            out = state.client_final(token)
            return self._success(conn, state.user, out)
        except SaslAuthenticationFailedError as err:
            user = getattr(state, "name", "") or user
            conn.sasl = _FAILED
            mechanism = state if state == "PLAIN" else state.mechanism
            log.warning("Kafka SASL %s authentication failed from %s (user %.64r): %s",
                        mechanism, conn.peer, user, err)
            now = time.monotonic()
            yield Park(now + self._delays.failed(conn.peer.rpartition(":")[0], now), ())
            return _auth_answer(SaslAuthenticationFailedError.code,
                                f"Authentication failed during authentication due to "
                                f"invalid credentials with SASL mechanism {mechanism}")

    def _plain_verifier(self, user: str):
        """PLAIN checks against the user's SCRAM-SHA-512 verifier, else its SHA-256 one."""
        for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
            cred = self._users.credential(user, mechanism)
            if cred is not None:
                return mechanism, cred
        return "SCRAM-SHA-512", None

    @staticmethod
    def _success(conn: KafkaConn, user: str, token: bytes) -> dict:
        conn.authenticate(f"User:{user}")
        log.info("Kafka client %s authenticated as %s", conn.peer, conn.principal)
        return _auth_answer(0, None, token)

    # --- KIP-554 ------------------------------------------------------------------------------
    def _may(self, conn: KafkaConn, operation: AclOperation) -> bool:
        """Kafka's Cluster Describe or Alter, and never User:ANONYMOUS (the module doc)."""
        return conn.principal != ANONYMOUS and \
            self._authz.allows(conn, operation, ResourceType.CLUSTER)

    def describe_scram(self, conn: KafkaConn, version: int, body: dict) -> dict:
        users = None if body["users"] is None else [u["name"] for u in body["users"]]
        if not self._may(conn, AclOperation.DESCRIBE):
            # Per user only: librdkafka 2.16 aborts the process (munmap_chunk) on a top-level
            # error in this response, the form Kafka's error response has.
            return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "results": [
                        {"user": user, "error_code": errors.ClusterAuthorizationFailedError.code,
                         "error_message": _ANONYMOUS_ADMIN, "credential_infos": []}
                        for user in users or ()]}
        return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "results": [
            {"user": user, "error_code": code, "error_message": msg, "credential_infos": [
                {"mechanism": MECHANISM_IDS[m], "iterations": i} for m, i in infos]}
            for user, code, msg, infos in self._users.describe(users)]}

    def alter_scram(self, conn: KafkaConn, version: int, body: dict) -> dict:
        if not self._may(conn, AclOperation.ALTER):
            names = dict.fromkeys(op["name"] for op in body["deletions"] + body["upsertions"])
            return {"throttle_time_ms": 0, "results": [
                {"user": user, "error_code": errors.ClusterAuthorizationFailedError.code,
                 "error_message": _ANONYMOUS_ADMIN} for user in names]}
        results = self._users.alter(
            [[d["name"], _mechanism(d["mechanism"])] for d in body["deletions"]],
            [[u["name"], _mechanism(u["mechanism"]), u["iterations"], bytes(u["salt"]),
              bytes(u["salted_password"])] for u in body["upsertions"]])
        return {"throttle_time_ms": 0, "results": [
            {"user": user, "error_code": code, "error_message": msg}
            for user, code, msg in results]}


def _mechanism(number: int) -> str:
    return _MECHANISM_NAMES.get(number, f"mechanism {number}")


def _auth_answer(code: int, message: str | None, token: bytes = b"") -> dict:
    return {"error_code": code, "error_message": message, "auth_bytes": token,
            "session_lifetime_ms": 0}


assert set(SCRAM_MECHANISMS) == set(MECHANISM_IDS)
