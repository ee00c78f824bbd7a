"""SASL's pure parts: SCRAM against RFC 7677's test vector and its own client, PLAIN parsing,
and the credential checks (mq/protocol/kafka/sasl.py)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from mq.errors import SaslAuthenticationFailedError
from mq.protocol.kafka.sasl import (
    ScramServer,
    check_iterations,
    check_plain,
    derive_credential,
    parse_plain,
)

# RFC 7677 section 3: user "user", password "pencil"
_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
_SERVER_FIRST = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                 b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                 b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _rfc_server(password: str = "pencil") -> ScramServer:
    cred = derive_credential("SCRAM-SHA-256", password, 4096, _SALT)
    return ScramServer("SCRAM-SHA-256", {"user": cred}.get, nonce=_SERVER_NONCE)


def test_rfc7677_vector():
    server = _rfc_server()
    assert server.client_first(_CLIENT_FIRST) == _SERVER_FIRST
    assert server.client_final(_CLIENT_FINAL) == _SERVER_FINAL
    assert server.user == "user"


def test_wrong_password_and_replayed_or_tampered_final_fail():
    server = _rfc_server("pencil2")
    server.client_first(_CLIENT_FIRST)
    with pytest.raises(SaslAuthenticationFailedError, match="invalid credentials"):
        server.client_final(_CLIENT_FINAL)
    assert server.user is None
    # the final message again (the exchange is over), and a proof for another nonce
    with pytest.raises(SaslAuthenticationFailedError, match="out of order"):
        server.client_final(_CLIENT_FINAL)
    server = ScramServer("SCRAM-SHA-256", _rfc_server().__dict__["_lookup"])
    server.client_first(_CLIENT_FIRST)          # a random server nonce this time
    with pytest.raises(SaslAuthenticationFailedError, match="nonce"):
        server.client_final(_CLIENT_FINAL)


def _client_exchange(mechanism: str, user: str, password: str, server: ScramServer) -> None:
    """A SCRAM client (RFC 5802's algorithm) against ``server``."""
    h = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    bare = f"n={user},r=clientnonce"
    first = server.client_first(f"n,,{bare}".encode()).decode()
    attrs = dict(p.split("=", 1) for p in first.split(","))
    salted = hashlib.pbkdf2_hmac(h, password.encode(), base64.b64decode(attrs["s"]),
                                 int(attrs["i"]))
    client_key = hmac.digest(salted, b"Client Key", h)
    without_proof = f"c=biws,r={attrs['r']}"
    auth = f"{bare},{first},{without_proof}".encode()
    sig = hmac.digest(hashlib.new(h, client_key).digest(), auth, h)
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, sig))).decode()
    final = server.client_final(f"{without_proof},p={proof}".encode())
    expected = hmac.digest(hmac.digest(salted, b"Server Key", h), auth, h)
    assert final == b"v=" + base64.b64encode(expected)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_round_trip_both_mechanisms(mechanism):
    cred = derive_credential(mechanism, "s3cret")
    assert len(cred.salt) == 32 and cred.iterations == 4096
    server = ScramServer(mechanism, {"alice": cred}.get)
    _client_exchange(mechanism, "alice", "s3cret", server)
    assert server.user == "alice"
    with pytest.raises(SaslAuthenticationFailedError, match="invalid credentials"):
        _client_exchange(mechanism, "alice", "guess", ScramServer(mechanism,
                                                                  {"alice": cred}.get))


@pytest.mark.parametrize("message", [
    b"", b"garbage", b"p=tls-unique,,n=user,r=abc", b"n,,r=abc", b"n,,n=user",
    b"n,,n=user,r=", b"n,a=other,n=user,r=abc", b"n,,n=us=er,r=abc", b"\xff\xfe",
    b"n,,m=ext,n=user,r=abc", b"n,,n=nobody,r=abc"])
def test_malformed_client_first_fails(message):
    with pytest.raises(SaslAuthenticationFailedError):
        _rfc_server().client_first(message)


@pytest.mark.parametrize("final", [
    b"", b"c=biws", b"c=biws,r=x,p=", b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)"
    b"hNlF$k0,p=!!notbase64", b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=AAAA", b"c=cD10bHM=,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzb"])
def test_malformed_client_final_fails(final):
    server = _rfc_server()
    server.client_first(_CLIENT_FIRST)
    with pytest.raises(SaslAuthenticationFailedError):
        server.client_final(final)


def test_user_names_are_unescaped():
    cred = derive_credential("SCRAM-SHA-256", "pw")
    server = ScramServer("SCRAM-SHA-256", {"a,b=c": cred}.get)
    server.client_first(b"n,,n=a=2Cb=3Dc,r=xyz")
    assert server.name == "a,b=c"


def test_plain_parsing():
    assert parse_plain(b"\0alice\0pw") == ("", "alice", "pw")
    assert parse_plain(b"alice\0alice\0p\xc3\xa9") == ("alice", "alice", "p\u00e9")
    for bad in (b"", b"alice", b"\0alice", b"\0\0pw", b"\0alice\0", b"\0a\0b\0c",
                b"bob\0alice\0pw", b"\0\xff\0pw"):
        with pytest.raises(SaslAuthenticationFailedError):
            parse_plain(bad)


def test_plain_checks_against_the_scram_verifier():
    cred = derive_credential("SCRAM-SHA-512", "right")
    check_plain("SCRAM-SHA-512", cred, "right")
    for mechanism, c, password in (("SCRAM-SHA-512", cred, "wrong"),
                                   ("SCRAM-SHA-512", None, "right")):
        with pytest.raises(SaslAuthenticationFailedError):
            check_plain(mechanism, c, password)


def test_iterations_range():
    check_iterations(4096)
    check_iterations(16384)
    for bad in (4095, 16385, 0, "4096"):
        with pytest.raises(ValueError, match="4096 to 16384"):
            check_iterations(bad)


def test_librdkafka_2_0_client_nonce_twice_is_accepted():
    """librdkafka 2.0 (Debian's kcat) puts its client nonce again before the full nonce;
    Kafka accepts a final nonce that ends with the one it sent, and so does mq."""
    cred = derive_credential("SCRAM-SHA-256", "pw")
    server = ScramServer("SCRAM-SHA-256", {"u": cred}.get, nonce="SRV")
    first = server.client_first(b"n,,n=u,r=CLI").decode()
    salted = hashlib.pbkdf2_hmac("sha256", b"pw", cred.salt, 4096)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    without_proof = "c=biws,r=CLICLISRV"
    auth = f"n=u,r=CLI,{first},{without_proof}".encode()
    sig = hmac.digest(hashlib.sha256(client_key).digest(), auth, "sha256")
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, sig))).decode()
    server.client_final(f"{without_proof},p={proof}".encode())
    assert server.user == "u"
