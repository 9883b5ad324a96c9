"""Certificates and kubeconfigs for the local control plane, and for other servers the tests secure with TLS.

Like controller-runtime's envtest, the API server gets a serving certificate from a
throwaway CA, and each client (the admin user, controller-manager, scheduler, kwok)
gets a client certificate whose subject RBAC recognises. Files are created once per
state folder and reused, so a restarted stack keeps working kubeconfigs. `serving` and
`client` issue more from the same CA, e.g. for a PostgreSQL server with ssl=on.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=3650)


@dataclasses.dataclass(frozen=True)
class ClientIdentity:
    """A client of the API server: its certificate subject and its kubeconfig file."""

    name: str
    common_name: str
    organization: str | None = None


ADMIN = ClientIdentity("admin", "ferry-admin", "system:masters")
CONTROLLER_MANAGER = ClientIdentity("controller-manager", "system:kube-controller-manager")
SCHEDULER = ClientIdentity("scheduler", "system:kube-scheduler")
KWOK = ClientIdentity("kwok", "ferry-kwok", "system:masters")
CLIENTS = (ADMIN, CONTROLLER_MANAGER, SCHEDULER, KWOK)


@dataclasses.dataclass(frozen=True)
class Pki:
    """Paths of the control plane's key material inside one folder."""

    folder: Path

    @property
    def ca_cert(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.folder / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.folder / "apiserver.key"

    @property
    def service_account_key(self) -> Path:
        return self.folder / "service-account.key"

    @property
    def service_account_pub(self) -> Path:
        return self.folder / "service-account.pub"

    def client_cert(self, client: ClientIdentity) -> Path:
        return self.folder / f"{client.name}.crt"

    def client_key(self, client: ClientIdentity) -> Path:
        return self.folder / f"{client.name}.key"

    def ensure_ca(self) -> None:
        """Creates the CA if it is missing."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if not (self.ca_cert.exists() and self.ca_key.exists()):
            key = _new_key()
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ferry-local-ca")])
            cert = (
                _builder(name, name, key.public_key())
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
                .sign(key, hashes.SHA256())
            )
            _write(self.ca_key, self.ca_cert, key, cert)

    def ensure(self) -> None:
        """Creates whatever key material is missing; keeps what exists."""
        self.ensure_ca()
        ca_key, ca_cert = self._load_ca()
        if not self.serving_cert.exists():
            key = _new_key()
            sans: list[x509.GeneralName] = [
                x509.DNSName(dns) for dns in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
            ]
            sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "::1", "10.0.0.1")]
            cert = (
                _builder(_subject("kube-apiserver"), ca_cert.subject, key.public_key())
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256())
            )
            _write(self.serving_key, self.serving_cert, key, cert)
        for client in CLIENTS:
            self.client(client)
        if not self.service_account_key.exists():
            sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self.service_account_key.write_bytes(
                sa_key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.TraditionalOpenSSL,
                    serialization.NoEncryption(),
                )
            )
            self.service_account_key.chmod(0o600)
            self.service_account_pub.write_bytes(
                sa_key.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )

    def serving(self, name: str, hosts: Sequence[str]) -> tuple[Path, Path]:
        """(certificate, key) of a server reached as any of `hosts` (DNS names or IP addresses); made once."""
        cert_path, key_path = self.folder / f"{name}.crt", self.folder / f"{name}.key"
        if not cert_path.exists():
            self.ensure_ca()
            ca_key, ca_cert = self._load_ca()
            key = _new_key()
            cert = (
                _builder(_subject(name), ca_cert.subject, key.public_key())
                .add_extension(x509.SubjectAlternativeName([_general_name(host) for host in hosts]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256())
            )
            _write(key_path, cert_path, key, cert)
        return cert_path, key_path

    def client(self, client: ClientIdentity) -> tuple[Path, Path]:
        """(certificate, key) of a client whose subject is `client`'s; made once."""
        if not self.client_cert(client).exists():
            self.ensure_ca()
            ca_key, ca_cert = self._load_ca()
            key = _new_key()
            cert = (
                _builder(_subject(client.common_name, client.organization), ca_cert.subject, key.public_key())
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256())
            )
            _write(self.client_key(client), self.client_cert(client), key, cert)
        return self.client_cert(client), self.client_key(client)

    def write_kubeconfig(self, client: ClientIdentity, server: str, path: Path) -> Path:
        """Writes a kubeconfig for `client` that trusts the stack's CA (rewritten on each start)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "ferry-local", "cluster": {"server": server, "certificate-authority": str(self.ca_cert)}}
            ],
            "users": [
                {
                    "name": client.common_name,
                    "user": {
                        "client-certificate": str(self.client_cert(client)),
                        "client-key": str(self.client_key(client)),
                    },
                }
            ],
            "contexts": [{"name": "ferry-local", "context": {"cluster": "ferry-local", "user": client.common_name}}],
            "current-context": "ferry-local",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    def _load_ca(self) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{self.ca_key} is not an EC private key; delete {self.folder} to regenerate")
        return key, x509.load_pem_x509_certificate(self.ca_cert.read_bytes())


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _subject(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
    )


def _write(key_path: Path, cert_path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
