"""The sandbox's certificates: one cluster CA, a front-proxy CA (aggregation layer), the API server's
serving certificate, client certificates per identity (admin, node, controllers) and the
ServiceAccount signing key. Written once under ``<state>/pki``; reused by later ``up`` runs.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .layout import Layout

_VALIDITY = dt.timedelta(days=365)

#: client identities: file stem -> (CN, O). The names are the ones Kubernetes' default RBAC binds.
CLIENTS: dict[str, tuple[str, str | None]] = {
    "admin": ("sluiceway-sandbox-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", None),
    "scheduler": ("system:kube-scheduler", None),
    "proxy": ("system:kube-proxy", None),
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
}


def node_client(node_name: str) -> tuple[str, str]:
    """The node agent authenticates as a kubelet would: Node authorizer + NodeRestriction apply."""
    return f"system:node:{node_name}", "system:nodes"


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _load(pair: Pair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return cert, key


def ensure_ca(pair: Pair, cn: str) -> None:
    if pair.cert.exists() and pair.key.exists():
        return
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY * 5)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write_key(pair.key, key)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def issue(
    ca: Pair,
    out: Pair,
    cn: str,
    org: str | None = None,
    *,
    server: bool = False,
    client: bool = False,
    dns: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> Pair:
    """Issue (once) a leaf certificate signed by ``ca``."""
    if out.cert.exists() and out.key.exists():
        return out
    ca_cert, ca_key = _load(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn, org))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(out.key, key)
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return out


def ensure_sa_keys(layout: Layout) -> None:
    """RSA key pair that signs ServiceAccount tokens (the API server and the token controller)."""
    if layout.sa_key.exists() and layout.sa_pub.exists():
        return
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(layout.sa_key, key)
    layout.sa_pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def pair(layout: Layout, stem: str) -> Pair:
    return Pair(layout.pki_dir / f"{stem}.crt", layout.pki_dir / f"{stem}.key")


def ca_pair(layout: Layout) -> Pair:
    return Pair(layout.ca_cert, layout.ca_key)


def front_proxy_ca(layout: Layout) -> Pair:
    return pair(layout, "front-proxy-ca")


def ensure_all(layout: Layout) -> None:
    """Every certificate and key the control plane and the agent need."""
    ca = ca_pair(layout)
    ensure_ca(ca, "sluiceway-sandbox-ca")
    ensure_ca(front_proxy_ca(layout), "sluiceway-sandbox-front-proxy-ca")
    d = layout.cluster_domain
    issue(
        ca,
        pair(layout, "apiserver"),
        "kube-apiserver",
        server=True,
        dns=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            f"kubernetes.default.svc.{d}",
        ),
        ips=("127.0.0.1", layout.bridge_ip, layout.kubernetes_service_ip),
    )
    issue(front_proxy_ca(layout), pair(layout, "front-proxy-client"), "front-proxy-client", client=True)
    for stem, (cn, org) in CLIENTS.items():
        issue(ca, pair(layout, stem), cn, org, client=True)
    cn, org = node_client(layout.node_name)
    issue(ca, pair(layout, "node"), cn, org, client=True)
    ensure_sa_keys(layout)
