"""A throwaway certificate authority for local TLS: a self-signed CA and the leaf certificates it issues, as PEM files.

The tests and the local stack use it wherever a real service must speak TLS (a backend behind ``https://``, a broker
with SSL listeners): ``CertificateAuthority.create(directory)`` writes ``ca.pem`` and ``ca-key.pem``; ``issue(name,
hosts)`` writes ``<name>.pem`` and ``<name>-key.pem`` signed by it, for the DNS names and IP addresses given, usable
as a server and as a client certificate. Keys are ECDSA P-256, written unencrypted in PKCS#8 (what Go, OpenSSL,
Python's ``ssl`` and Kafka's PEM key stores all read). Nothing here is for production: the CA key sits beside its
certificate.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 30


@dataclass(frozen=True, slots=True)
class Issued:
    """A leaf certificate and its key, as files."""

    certfile: Path
    keyfile: Path


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    directory: Path
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cafile(self) -> Path:
        return self.directory / "ca.pem"

    @classmethod
    def create(cls, directory: Path, name: str = "tokenpools test CA", now: dt.datetime | None = None
               ) -> CertificateAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        start = (now or dt.datetime.now(dt.timezone.utc)) - dt.timedelta(minutes=5)
        certificate = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        ca = cls(directory, certificate, key)
        _write(ca.cafile, certificate.public_bytes(serialization.Encoding.PEM))
        _write(directory / "ca-key.pem", _pkcs8(key))
        return ca

    def issue(self, name: str, hosts: Sequence[str] = ("localhost", "127.0.0.1"), now: dt.datetime | None = None
              ) -> Issued:
        """``<name>.pem`` / ``<name>-key.pem`` for ``hosts`` (DNS names or IP addresses; CN = ``name``)."""
        if not hosts:
            raise ValueError("a certificate needs at least one host name or address")
        key = ec.generate_private_key(ec.SECP256R1())
        start = (now or dt.datetime.now(dt.timezone.utc)) - dt.timedelta(minutes=5)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.certificate.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        issued = Issued(self.directory / f"{name}.pem", self.directory / f"{name}-key.pem")
        _write(issued.certfile, certificate.public_bytes(serialization.Encoding.PEM))
        _write(issued.keyfile, _pkcs8(key))
        return issued


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _pkcs8(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)
