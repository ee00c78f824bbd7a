"""TLS for the Kafka listener: the server context, each connection's session, the principal.

A listener spec ``SSL://HOST:PORT`` or ``SASL_SSL://HOST:PORT`` serves TLS (``addresses.py``
parses the protocol; ``HOST:PORT``, ``PLAINTEXT://`` and ``SASL_PLAINTEXT://`` serve plain
TCP). The context (``server_context``) is built once at start from ``kafka_ssl_certfile`` and
``kafka_ssl_keyfile``, with ``kafka_ssl_cafile`` requiring a client certificate signed by that CA; a file that cannot be read, a key that does
not match its certificate or asks for a password, stops the broker with one line.

Invariants of a session (``TlsSession``), on the broker's non-blocking selector loop:

- the handshake is driven by the loop: ``handshake`` returns the selector events OpenSSL waits
  for (want-read, want-write) and never blocks; a handshake not finished by its deadline
  (``HANDSHAKE_TIMEOUT_S``) closes the connection (the listener's timers);
- TLS 1.2 at least, and no renegotiation (``OP_NO_RENEGOTIATION``; TLS 1.3 has none): a
  client's renegotiation ClientHello fails its connection;
- ``recv`` leaves no decrypted byte inside OpenSSL (``pending()``), since select reports the
  kernel socket only: bytes held there would wait for the peer's next packet;
- records go out copied, never with ``sendfile`` (the kernel cannot encrypt them; Kafka copies
  too): ``copy_head_region`` preads ``COPY_BYTES`` of a Fetch's region at a time.

The principal (``principal``): Kafka's ``User:`` and the client certificate's subject in
RFC 2253 form, most specific name first (Java's ``X500Principal.getName()``, which Kafka's
default principal builder uses: ``User:CN=alice,OU=eng,O=acme,C=US``); ``User:ANONYMOUS``
without a client certificate, as in Kafka.
"""

from __future__ import annotations

import os
import selectors
import socket
import ssl
from collections import deque

from mq.errors import ConfigError, RemoteProtocolError
from mq.protocol.kafka.codec import FileRegion

__all__ = ["COPY_BYTES", "HANDSHAKE_TIMEOUT_S", "TlsSession", "copy_head_region", "principal",
           "server_context"]

# A client that connects and never finishes its handshake holds a descriptor and a little
# OpenSSL state: 10 s is 100 times a loopback handshake's worst case seen here (~0.1 s
# under load) and still frees a slowloris' descriptors quickly.
HANDSHAKE_TIMEOUT_S = 10.0
# A Fetch's records are read and encrypted this much at a time: 16 TLS records of 16 KiB, so
# one connection holds at most 256 KiB of copies beyond its responses, and a pread and write
# are amortized over enough bytes that their fixed cost stays under 1 % (bench.kafka_tls).
COPY_BYTES = 256 * 1024

ANONYMOUS = "User:ANONYMOUS"

# RFC 2253's keywords for the attribute names Python's ``getpeercert`` gives; an e-mail address
# is written as Java writes it (``_ava``), any other with Python's name (Java writes its OID
# and the hex of its DER value, which ``getpeercert`` does not give).
_RDN_KEYWORDS = {
    "commonName": "CN", "countryName": "C", "localityName": "L",
    "stateOrProvinceName": "ST", "organizationName": "O", "organizationalUnitName": "OU",
    "streetAddress": "STREET", "domainComponent": "DC", "userId": "UID",
}


def _no_password() -> str:
    raise ConfigError("kafka_ssl_keyfile is encrypted: give the broker an unencrypted key "
                      "(readable by its user only)")


def _readable(key: str, path: str) -> None:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as err:
        raise ConfigError(f"{key} {path!r}: cannot read it: {err.strerror}") from err


def server_context(certfile: str, keyfile: str, cafile: str = "") -> ssl.SSLContext:
    """The listeners' TLS context. Raises ``ConfigError`` (one line) for a missing or
    unreadable file, a certificate or key that does not load, a key not matching the
    certificate, an encrypted key, or a CA file without a certificate."""
    if not certfile or not keyfile:
        raise ConfigError("an SSL:// Kafka listener needs kafka_ssl_certfile and "
                          "kafka_ssl_keyfile (PEM files)")
    for key, path in (("kafka_ssl_certfile", certfile), ("kafka_ssl_keyfile", keyfile),
                      ("kafka_ssl_cafile", cafile)):
        if path:
            _readable(key, path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    try:
        ctx.load_cert_chain(certfile, keyfile, password=_no_password)
    except ssl.SSLError as err:
        what = "does not match kafka_ssl_certfile" if "MISMATCH" in str(err) else \
            "or kafka_ssl_certfile is not a PEM certificate and key"
        raise ConfigError(f"kafka_ssl_keyfile {keyfile!r} {what} {certfile!r}: "
                          f"{err.reason or err}") from err
    if cafile:
        try:
            ctx.load_verify_locations(cafile=cafile)
        except ssl.SSLError as err:
            raise ConfigError(f"kafka_ssl_cafile {cafile!r} holds no PEM certificate: "
                              f"{err.reason or err}") from err
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _escape(value: str) -> str:
    """An attribute value escaped as Java's RFC 2253 form does: its ``,=+<>#;"\\``
    anywhere, a space at either end."""
    out = "".join("\\" + c if c in ',=+<>#;"\\' else c for c in value)
    if out.startswith(" "):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def _ava(name: str, value: str) -> str:
    """One attribute: RFC 2253's keyword, or for an e-mail address its OID and the hex of
    its DER IA5String, as Java writes it."""
    if name in _RDN_KEYWORDS:
        return f"{_RDN_KEYWORDS[name]}={_escape(value)}"
    if name == "emailAddress" and value.isascii() and len(value) < 128:
        return f"1.2.840.113549.1.9.1=#16{len(value):02x}{value.encode().hex()}"
    return f"{name}={_escape(value)}"


def principal(cert: dict | None) -> str:
    """Kafka's principal for a verified peer certificate as ``getpeercert()`` returns it
    (None or no subject: ``User:ANONYMOUS``). Pure."""
    subject = (cert or {}).get("subject") or ()
    if not subject:
        return ANONYMOUS
    rdns = ["+".join(_ava(name, value) for name, value in rdn) for rdn in reversed(subject)]
    return "User:" + ",".join(rdns)


def copy_head_region(parts: deque) -> bool:
    """Replace the ``FileRegion`` at the head of ``parts`` by its first ``COPY_BYTES`` read
    into bytes, followed by the rest of the region if any. Returns True when the region is
    read in full (its descriptor closed). Raises ``OSError`` when the file ends before the
    region does (the descriptor stays the caller's to close, as the region is still there)."""
    region: FileRegion = parts[0]
    data = os.pread(region.fd, min(region.length, COPY_BYTES), region.offset)
    if not data:
        raise OSError(f"segment file ended {region.length} bytes early")
    if len(data) == region.length:
        os.close(region.fd)
        parts[0] = data
        return True
    parts[0] = FileRegion(region.fd, region.offset + len(data), region.length - len(data))
    parts.appendleft(data)
    return False


def _reason(err: ssl.SSLError) -> str:
    """OpenSSL's reason, and for a refused certificate why (expired, unknown CA)."""
    why = getattr(err, "verify_message", None)
    return f"{err.reason or err} ({why})" if why else str(err.reason or err)


class TlsSession:
    """The TLS state of one connection, over its ``SSLSocket`` (non-blocking)."""

    def __init__(self, sock: ssl.SSLSocket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline          # monotonic seconds: the handshake must be done by
        self.established = False

    @classmethod
    def accept(cls, context: ssl.SSLContext, sock: socket.socket,
               deadline: float) -> TlsSession:
        """Wrap an accepted non-blocking socket; the handshake is left to ``handshake``."""
        return cls(context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False),
                   deadline)

    def handshake(self) -> int:
        """Advance the handshake: the selector events it waits for, 0 once it is done.
        Raises ``RemoteProtocolError`` when it fails (garbage, an unverified or expired
        certificate, a protocol below TLS 1.2), ``OSError`` when the client went away (a
        client may drop a connection it no longer needs mid-handshake: nothing to log)."""
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            return selectors.EVENT_READ
        except ssl.SSLWantWriteError:
            return selectors.EVENT_WRITE
        except ssl.SSLEOFError as err:
            raise ConnectionAbortedError("the client closed its connection during the TLS "
                                         "handshake") from err
        except ssl.SSLError as err:
            raise RemoteProtocolError(f"TLS handshake failed: {_reason(err)}") from err
        self.established = True
        return 0

    @property
    def principal(self) -> str:
        return principal(self.sock.getpeercert())

    def recv(self, size: int) -> bytes:
        """Up to about ``size`` bytes decrypted, and whatever OpenSSL still holds decrypted
        (``pending``); b"" when the peer closed. Raises ``BlockingIOError`` when nothing
        came, ``RemoteProtocolError`` for a TLS error (a renegotiation, a bad record)."""
        chunks: list[bytes] = []
        total = 0
        while total < size or self.sock.pending():
            try:
                data = self.sock.recv(max(size - total, self.sock.pending(), 1))
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                if not chunks:
                    raise BlockingIOError from None
                break
            except ssl.SSLEOFError:         # closed without close_notify: an EOF as any
                break
            except ssl.SSLError as err:
                raise RemoteProtocolError(f"TLS: {_reason(err)}") from err
            if not data:            # the peer closed: what came first is served first
                break
            chunks.append(data)
            total += len(data)
        return b"".join(chunks)

    def send(self, data) -> int:
        """Encrypt and write what the socket takes of ``data``. Raises ``BlockingIOError``
        when it takes nothing now, ``OSError`` when the peer is gone."""
        try:
            return self.sock.send(data)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
            raise BlockingIOError from None
