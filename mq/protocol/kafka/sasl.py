"""SASL for Kafka clients, sans-I/O: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, 7677;
Kafka's KIP-84), server side, over stored verifiers only.

A user's credential for one SCRAM mechanism is ``ScramCredential(salt, iterations,
stored_key, server_key)``: ``SaltedPassword = PBKDF2(HMAC-H, password, salt, iterations)``,
``StoredKey = H(HMAC(SaltedPassword, "Client Key"))``, ``ServerKey = HMAC(SaltedPassword,
"Server Key")``. The password is never kept: a stolen verifier lets its holder act as the
server to a client, not log in (it would need ``ClientKey``, which ``StoredKey`` hides). PLAIN
is checked against the same verifier: the password given is salted with the stored salt and
iterations, and its StoredKey compared in constant time (``hmac.compare_digest``).

``ScramServer`` is one exchange: ``client_first`` -> server-first message, ``client_final``
-> server-final message; any malformed message, unknown user or wrong proof raises
``SaslAuthenticationFailedError`` (Kafka's SASL_AUTHENTICATION_FAILED, 58), whose message never
says which: a client learns nothing about which users exist. Iterations: at least 4096 (RFC
7677's minimum and Kafka's), at most 16384 (Kafka's maximum).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import os
import secrets
from typing import Final

from mq.errors import SaslAuthenticationFailedError

__all__ = ["MECHANISMS", "SCRAM_MECHANISMS", "ScramCredential", "ScramServer",
           "check_plain", "derive_credential", "parse_plain",
           "salted_password", "credential_from_salted", "check_iterations"]

SCRAM_MECHANISMS: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISMS: Final = ("PLAIN", *SCRAM_MECHANISMS)
# Kafka's ScramMechanism ids (AlterUserScramCredentials and Describe, KIP-554)
MECHANISM_IDS: Final = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
MIN_ITERATIONS: Final = 4096
MAX_ITERATIONS: Final = 16384
DEFAULT_ITERATIONS: Final = 4096
_MAX_NAME = 255                       # Kafka's limit on nothing; ours on a log line and a key
_FAILED = "Authentication failed: invalid credentials"


@dataclasses.dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def check_iterations(iterations: int) -> None:
    """Raises ``ValueError`` for an iteration count outside 4096..16384."""
    if not isinstance(iterations, int) or not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"SCRAM iterations must be from {MIN_ITERATIONS} to {MAX_ITERATIONS}, "
                         f"got {iterations!r}")


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(SCRAM_MECHANISMS[mechanism], password.encode(), salt,
                               iterations)


def credential_from_salted(mechanism: str, salted: bytes, salt: bytes,
                           iterations: int) -> ScramCredential:
    """The verifier from a SaltedPassword (what AlterUserScramCredentials carries)."""
    h = SCRAM_MECHANISMS[mechanism]
    client_key = hmac.digest(salted, b"Client Key", h)
    return ScramCredential(salt, iterations, hashlib.new(h, client_key).digest(),
                           hmac.digest(salted, b"Server Key", h))


def derive_credential(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS,
                      salt: bytes | None = None) -> ScramCredential:
    """A new verifier for ``password`` (a random 32-byte salt unless given)."""
    check_iterations(iterations)
    salt = os.urandom(32) if salt is None else salt
    return credential_from_salted(mechanism, salted_password(mechanism, password, salt,
                                                             iterations), salt, iterations)


def parse_plain(message: bytes) -> tuple[str, str, str]:
    """RFC 4616's ``[authzid] NUL authcid NUL passwd`` -> (authzid, user, password). Raises
    ``SaslAuthenticationFailedError`` for anything else (two NULs exactly, an empty user or
    password, bad UTF-8, an authzid other than the user: Kafka refuses acting for another)."""
    try:
        authzid, user, password = bytes(message).decode("utf-8").split("\0")
    except (UnicodeDecodeError, ValueError) as err:
        raise SaslAuthenticationFailedError("PLAIN: the message is not authzid NUL user NUL "
                                      "password") from err
    if not user or not password or len(user) > _MAX_NAME:
        raise SaslAuthenticationFailedError("PLAIN: empty user or password")
    if authzid and authzid != user:
        raise SaslAuthenticationFailedError("PLAIN: an authorization id other than the user")
    return authzid, user, password


def check_plain(mechanism: str, credential: ScramCredential | None, password: str) -> None:
    """Raises ``SaslAuthenticationFailedError`` unless ``password`` matches ``credential`` (None: no
    such user; the derivation runs anyway, so both cost the same time)."""
    cred = credential or ScramCredential(b"\0" * 32, DEFAULT_ITERATIONS, b"", b"")
    derived = credential_from_salted(
        mechanism, salted_password(mechanism, password, cred.salt, cred.iterations),
        cred.salt, cred.iterations)
    if not hmac.compare_digest(derived.stored_key, cred.stored_key) or credential is None:
        raise SaslAuthenticationFailedError(_FAILED)


def _attributes(text: str) -> dict[str, str]:
    """``a=1,b=2`` -> {"a": "1", "b": "2"}; raises ``SaslAuthenticationFailedError``."""
    out: dict[str, str] = {}
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=":
            raise SaslAuthenticationFailedError(f"SCRAM: malformed attribute {part[:20]!r}")
        out.setdefault(part[0], part[2:])
    return out


def _unescape_name(name: str) -> str:
    """RFC 5802's saslname: ``=2C`` is ``,`` and ``=3D`` is ``=``; any other ``=`` is bad."""
    if name.replace("=2C", "").replace("=3D", "").count("="):
        raise SaslAuthenticationFailedError("SCRAM: malformed user name")
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """One SCRAM exchange, server side. ``lookup(user)`` returns the user's credential for
    this mechanism, or None. After ``client_final`` succeeds, ``user`` is who logged in."""

    def __init__(self, mechanism: str, lookup, nonce: str | None = None) -> None:
        self.mechanism = mechanism
        self._hash = SCRAM_MECHANISMS[mechanism]
        self._lookup = lookup
        self._server_nonce = nonce or secrets.token_urlsafe(24)
        self._state = "first"
        self._cred: ScramCredential | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self.user: str | None = None      # who logged in, once done
        self.name = ""                    # the user the client named (for the log)

    def _step(self, expected: str, message: bytes) -> str:
        """``message`` as text, if the exchange expects it now; the exchange fails unless the
        step succeeds (a second try is out of order). Raises ``SaslAuthenticationFailedError``."""
        if self._state != expected:
            raise SaslAuthenticationFailedError(f"SCRAM: client-{expected} message out of order")
        self._state = "failed"
        try:
            return bytes(message).decode("utf-8")
        except UnicodeDecodeError as err:
            raise SaslAuthenticationFailedError("SCRAM: not UTF-8") from err

    def client_first(self, message: bytes) -> bytes:
        """Raises ``SaslAuthenticationFailedError`` (malformed, channel binding asked, unknown
        user)."""
        text = self._step("first", message)
        # gs2-header: "n,," or "y,," (no channel binding); "p=" asks for one we do not offer;
        # an authzid "a=NAME," is allowed only naming the user itself.
        parts = text.split(",", 2)
        if len(parts) != 3 or parts[0] not in ("n", "y"):
            raise SaslAuthenticationFailedError("SCRAM: bad gs2 header (channel binding is not "
                                          "supported)")
        authzid, bare = parts[1], parts[2]
        attrs = _attributes(bare)
        if "m" in attrs or "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise SaslAuthenticationFailedError("SCRAM: client-first message lacks n= or r=")
        name = _unescape_name(attrs["n"])
        if authzid and _unescape_name(authzid.removeprefix("a=")) != name:
            raise SaslAuthenticationFailedError("SCRAM: an authorization id other than the user")
        if not name or len(name) > _MAX_NAME:
            raise SaslAuthenticationFailedError(_FAILED)
        self._cred = self._lookup(name)
        if self._cred is None:
            raise SaslAuthenticationFailedError(_FAILED)
        self.name = name
        self._client_first_bare = bare
        self._nonce = attrs["r"] + self._server_nonce
        self._server_first = (f"r={self._nonce},s={base64.b64encode(self._cred.salt).decode()}"
                              f",i={self._cred.iterations}")
        self._state = "final"
        return self._server_first.encode()

    def client_final(self, message: bytes) -> bytes:
        """The server-final message (``v=ServerSignature``). Raises
        ``SaslAuthenticationFailedError`` for a wrong nonce, proof or channel-binding echo."""
        text = self._step("final", message)
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise SaslAuthenticationFailedError("SCRAM: client-final message lacks p=")
        attrs = _attributes(without_proof)
        # The nonce must end with the one sent (Kafka's ScramSaslServer checks endsWith):
        # librdkafka 2.0 sends its client nonce again in front of it.
        if not attrs.get("r", "").endswith(self._nonce) or \
                attrs.get("c") not in ("biws", "eSws"):
            raise SaslAuthenticationFailedError("SCRAM: wrong nonce or channel binding")
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError as err:
            raise SaslAuthenticationFailedError("SCRAM: proof is not base64") from err
        cred, h = self._cred, self._hash
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.digest(cred.stored_key, auth_message, h)
        if len(proof) != len(signature):
            raise SaslAuthenticationFailedError(_FAILED)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(h, client_key).digest(), cred.stored_key):
            raise SaslAuthenticationFailedError(_FAILED)
        self._state = "done"
        self.user = self.name
        server_signature = hmac.digest(cred.server_key, auth_message, h)
        return b"v=" + base64.b64encode(server_signature)

    @property
    def expects_first(self) -> bool:
        return self._state == "first"
