"""A private certificate authority for services that authenticate each other with TLS (pgBackRest).

Generated on the controller, kept in the cluster's secrets directory like every other secret
(created once with ``O_EXCL``, read back on later runs): ``<name>/ca.key`` + ``ca.crt``, and per
node ``<name>/<node>.key`` + ``<node>.crt`` signed by that CA, with the node's name as the common
name (what a TLS server checks a client against) and its mesh address as the subject alternative
name (what a client checks the server against). EC P-256 keys: small, and every OpenSSL speaks them.

Rotating: delete the directory ``<secrets>/<name>`` and deploy again (every node gets new files).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from wireguard.keys import SecretDir

VALIDITY = datetime.timedelta(days=3650)


@dataclass(frozen=True)
class NodeCertificate:
    ca: str
    cert: str
    key: str

    def __repr__(self) -> str:  # never show the private key in logs or tracebacks
        return "NodeCertificate(<pem>)"


def _key_pem() -> str:
    # Stripped, as SecretDir reads it back: the first run renders what every later run does.
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return pem.decode().strip()


def _load_key(pem: str) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pem.encode(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name | None) -> x509.CertificateBuilder:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


class CertificateAuthority:
    """One CA per purpose (``name``), its certificates issued on demand and kept."""

    def __init__(self, secrets: SecretDir, name: str) -> None:
        self.secrets = secrets
        self.name = name

    def _ca(self) -> tuple[str, ec.EllipticCurvePrivateKey]:
        key = _load_key(self.secrets.get_or_create(f"{self.name}/ca.key", _key_pem))

        def issue() -> str:
            cert = (
                _certificate(f"memoryctl {self.name} CA", key, None)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
            return cert.public_bytes(serialization.Encoding.PEM).decode().strip()

        return self.secrets.get_or_create(f"{self.name}/ca.crt", issue), key

    def node(self, node: str, address: str) -> NodeCertificate:
        ca_pem, ca_key = self._ca()
        issuer = x509.load_pem_x509_certificate(ca_pem.encode()).subject
        key_pem = self.secrets.get_or_create(f"{self.name}/{node}.key", _key_pem)
        key = _load_key(key_pem)

        def issue() -> str:
            cert = (
                _certificate(node, key, issuer)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName(_names(node, address)), critical=False)
                .add_extension(
                    x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                    critical=False,
                )
                .sign(ca_key, hashes.SHA256())
            )
            return cert.public_bytes(serialization.Encoding.PEM).decode().strip()

        path = f"{self.name}/{node}.crt"
        cert_pem = self.secrets.get_or_create(path, issue)
        if not _certifies(cert_pem, node, address):  # the node's address changed, or an older issue
            cert_pem = issue()
            self.secrets.replace(path, cert_pem)
        return NodeCertificate(ca=ca_pem, cert=cert_pem, key=key_pem)


def _names(node: str, address: str) -> list[x509.GeneralName]:
    """The node's name and mesh address; the address also as a DNS name, because pgBackRest before
    2.51 (Debian 12 ships 2.45) matches the host it connects to against DNS names and the common
    name only, and refuses an address that only an IP entry holds."""
    return [x509.DNSName(node), x509.DNSName(address), x509.IPAddress(ipaddress.ip_address(address))]


def _certifies(cert_pem: str, node: str, address: str) -> bool:
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return set(names) == set(_names(node, address))
