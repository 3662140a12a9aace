"""The e2e kit's pure parts that KEDA's wiring rests on, checked without a cluster: the
certificates chain to their CA and name what is dialled; the wrapper module carries an
upstream go.mod's replace lines and refuses a local-directory one; the registration
routes external.metrics.k8s.io to a non-loopback endpoint."""

from __future__ import annotations

import base64
import ipaddress
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from e2e import gobuild, keda, pki  # noqa: E402


def cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def signed_by(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    key = ca.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    assert leaf.signature_hash_algorithm is not None
    key.verify(leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(leaf.signature_hash_algorithm))
    return leaf.issuer == ca.subject


def test_front_proxy_client_is_a_client_certificate_of_its_own_ca(tmp_path: Path) -> None:
    proxy = pki.front_proxy(tmp_path)
    ca, client = cert(proxy.ca.cert), cert(proxy.client.cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert signed_by(client, ca)
    assert client.subject.rfc4514_string() == f"CN={proxy.client_name}"
    usages = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert proxy.client.key.stat().st_mode & 0o077 == 0


def test_keda_certificate_names_the_services_and_addresses_dialled(tmp_path: Path) -> None:
    ca_pair = keda.write_certs(tmp_path, "192.0.2.7")
    ca, leaf = cert(ca_pair.cert), cert(tmp_path / "tls.crt")
    assert signed_by(leaf, ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "keda-metrics-apiserver.keda.svc" in sans.get_values_for_type(x509.DNSName)
    assert "keda-operator.keda.svc.cluster.local" in sans.get_values_for_type(x509.DNSName)
    assert set(sans.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("192.0.2.7"),
    }
    usages = set(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def test_a_leaf_must_be_for_a_server_or_a_client(tmp_path: Path) -> None:
    ca = pki.make_ca(pki.KeyPair(tmp_path / "ca.crt", tmp_path / "ca.key"), "ca")
    with pytest.raises(ValueError, match="server, a client or both"):
        pki.issue(ca, pki.KeyPair(tmp_path / "x.crt", tmp_path / "x.key"), "x")


def test_registration_routes_the_external_metrics_api_to_the_host_endpoint() -> None:
    objs = {o["kind"]: o for o in keda.registration("192.0.2.7", 40123, b"PEM")}
    svc, eps, api = objs["Service"], objs["EndpointSlice"], objs["APIService"]
    assert "selector" not in svc["spec"]  # no controller rewrites the endpoints
    assert eps["metadata"]["labels"]["kubernetes.io/service-name"] == svc["metadata"]["name"]
    assert eps["endpoints"][0]["addresses"] == ["192.0.2.7"]
    # the aggregator matches the EndpointSlice port by the Service port's name
    assert eps["ports"][0]["name"] == svc["spec"]["ports"][0]["name"]
    assert eps["ports"][0]["port"] == 40123
    assert api["metadata"]["name"] == keda.APISERVICE
    assert api["spec"]["service"]["port"] == svc["spec"]["ports"][0]["port"]
    assert base64.b64decode(api["spec"]["caBundle"]) == b"PEM"


def test_host_ip_is_never_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(keda.HOST_IP_ENV, "127.0.0.1")
    with pytest.raises(keda.KedaError, match=keda.HOST_IP_ENV):
        keda.host_ip()
    monkeypatch.setenv(keda.HOST_IP_ENV, "192.0.2.9")
    assert keda.host_ip() == "192.0.2.9"


def test_wrapper_carries_version_replaces_and_refuses_local_ones(tmp_path: Path) -> None:
    gomod = tmp_path / "go.mod"
    gomod.write_text(
        "module example.com/up\n\ngo 1.26\n\nreplace (\n"
        "\tk8s.io/api => k8s.io/api v0.35.5\n"
        "\texample.com/a v1.0.0 => example.com/b v1.2.0\n)\n"
    )
    assert gobuild.module_replaces(gomod, tmp_path) == [
        "-replace=k8s.io/api=k8s.io/api@v0.35.5",
        "-replace=example.com/a@v1.0.0=example.com/b@v1.2.0",
    ]
    gomod.write_text(gomod.read_text() + "replace example.com/c => ../c\n")
    with pytest.raises(gobuild.BuildError, match=r"local directory \.\./c"):
        gobuild.module_replaces(gomod, tmp_path)
