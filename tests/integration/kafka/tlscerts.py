"""Certificates for the TLS tests, made with ``cryptography`` (a test dependency).

``make_ca(dir, name)`` writes a CA's certificate and key; ``issue(ca, dir, name, subject,
...)`` a certificate it signs (a server's for 127.0.0.1, or a client's with the subject the
broker turns into the principal), expired on request. Keys are EC P-256: generated in a
millisecond, where RSA 2048 takes ~50 ms.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclasses.dataclass(frozen=True)
class Pair:
    cert: str           # PEM certificate path
    key: str            # PEM key path (unencrypted)
    _key: object = None
    _name: object = None


def _name(subject: dict[str, str]) -> x509.Name:
    oids = {"C": NameOID.COUNTRY_NAME, "O": NameOID.ORGANIZATION_NAME,
            "OU": NameOID.ORGANIZATIONAL_UNIT_NAME, "CN": NameOID.COMMON_NAME}
    return x509.Name([x509.NameAttribute(oids[k], v) for k, v in subject.items()])


def _write(directory: Path, stem: str, cert: x509.Certificate, key) -> tuple[str, str]:
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


def make_ca(directory: Path, cn: str) -> Pair:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name({"CN": cn})
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return Pair(*_write(directory, cn, cert, key), key, name)


def issue(ca: Pair, directory: Path, stem: str, subject: dict[str, str], *,
          server: bool = False, expired: bool = False) -> Pair:
    """A certificate signed by ``ca``; ``server``: for 127.0.0.1 and localhost."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    start, end = (now - datetime.timedelta(days=10), now - datetime.timedelta(days=1)) \
        if expired else (now - datetime.timedelta(days=1), now + datetime.timedelta(days=30))
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(ca._name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                              critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    cert = builder.sign(ca._key, hashes.SHA256())
    return Pair(*_write(directory, stem, cert, key))
