"""Certificates for HTTPS between kube-scheduler and the extender, generated in the test.

What a cluster gets from cert-manager or the chart's values, made here with ``cryptography``:
a self-signed CA, a serving certificate for the extender (SANs 127.0.0.1 and localhost) and a
client certificate for kube-scheduler (for mutual TLS, ``--tls-client-ca-file``).
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class ExtenderPKI:
    """PEM files written by :func:`generate_extender_pki`."""

    ca_crt: Path
    server_crt: Path
    server_key: Path
    client_crt: Path
    client_key: Path
    ca_key: Path

    def extender_args(self, *, require_client_cert: bool = False) -> list[str]:
        """``gpuplace-extender`` options serving HTTPS with the server certificate."""
        args = ["--tls-cert-file", str(self.server_crt), "--tls-key-file", str(self.server_key)]
        if require_client_cert:
            args += ["--tls-client-ca-file", str(self.ca_crt)]
        return args

    def scheduler_tls_config(self, *, client_cert: bool = False) -> dict[str, Any]:
        """kube-scheduler's ``tlsConfig``: ``caData`` (and ``certData``/``keyData``), base64 as
        ``[]byte`` fields are in the KubeSchedulerConfiguration's YAML/JSON."""
        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        cfg: dict[str, Any] = {"insecure": False, "caData": b64(self.ca_crt)}
        if client_cert:
            cfg.update(certData=b64(self.client_crt), keyData=b64(self.client_key))
        return cfg


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, key_path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)


def _builder(subject: str, issuer: x509.Name, public_key: Any) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer).public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=30)))


def generate_extender_pki(directory: Path, dns_names: tuple[str, ...] = ("localhost",)) -> ExtenderPKI:
    """Write a CA, an extender serving certificate for 127.0.0.1 and ``dns_names``, and a kube-scheduler
    client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = ExtenderPKI(*(directory / n for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key",
                                                 "ca.key")))
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuplace-extender-test-ca")])
    ca = (_builder("gpuplace-extender-test-ca", ca_name, ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    _write(pki.ca_crt, ca, ca_key, pki.ca_key)
    renew_server_certificate(pki, dns_names)

    cli_key = _key()
    cli = (_builder("kube-scheduler", ca.subject, cli_key.public_key())
           .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
           .sign(ca_key, hashes.SHA256()))
    _write(pki.client_crt, cli, cli_key, pki.client_key)
    return pki


def renew_server_certificate(pki: ExtenderPKI, dns_names: tuple[str, ...] = ("localhost",)) -> None:
    """Write a new extender serving certificate and key (new serial, new key) signed by the
    PKI's CA over the old files, as cert-manager renews into the Secret."""
    ca = x509.load_pem_x509_certificate(pki.ca_crt.read_bytes())
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    srv_key = _key()
    srv = (_builder("gpuplace-extender", ca.subject, srv_key.public_key())
           .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                       *(x509.DNSName(n) for n in dns_names)]), critical=False)
           .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
           .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    _write(pki.server_crt, srv, srv_key, pki.server_key)
