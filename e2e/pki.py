"""Throwaway certificate authorities and certificates for the test cluster.

Why our own: the API server's aggregation layer needs a front-proxy CA and client
certificate (kwokctl passes its admin certificate and no request-header CA), and KEDA's
operator, metrics adapter and the APIService that points at the adapter need a CA and a
serving certificate. Everything here lives as long as one cluster, so keys are small
(EC P-256) and nothing is ever reused across runs.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key on disk."""

    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(pair: KeyPair, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    pair.cert.parent.mkdir(parents=True, exist_ok=True)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    pair.key.chmod(0o600)


def _load(pair: KeyPair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{pair.key} is not an EC private key")
    return cert, key


def make_ca(pair: KeyPair, common_name: str) -> KeyPair:
    """A self-signed CA certificate and key written to ``pair``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(pair, cert, key)
    return pair


def issue(
    ca: KeyPair,
    pair: KeyPair,
    common_name: str,
    *,
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
) -> KeyPair:
    """A leaf certificate signed by ``ca``: a server one names its hosts (DNS names, IPs),
    a client one is identified by its common name; both at once for mutual TLS peers."""
    if not (server or client):
        raise ValueError("a certificate must be for a server, a client or both")
    ca_cert, ca_key = _load(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    _write(pair, builder.sign(ca_key, hashes.SHA256()), key)
    return pair


@dataclass(frozen=True)
class FrontProxy:
    """What kube-apiserver needs to serve aggregated APIs (the front proxy)."""

    ca: KeyPair
    client: KeyPair
    client_name: str


FRONT_PROXY_CLIENT = "front-proxy-client"


def front_proxy(root: Path) -> FrontProxy:
    """The front-proxy CA and the client certificate kube-apiserver presents to aggregated
    API servers, written under ``root``."""
    ca_pair = KeyPair(root / "front-proxy-ca.crt", root / "front-proxy-ca.key")
    ca = make_ca(ca_pair, "front-proxy-ca")
    client = issue(
        ca,
        KeyPair(root / "front-proxy-client.crt", root / "front-proxy-client.key"),
        FRONT_PROXY_CLIENT,
        client=True,
    )
    return FrontProxy(ca=ca, client=client, client_name=FRONT_PROXY_CLIENT)
