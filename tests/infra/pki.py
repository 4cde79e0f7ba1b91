"""A throwaway PKI made with the openssl CLI: one CA, serving certs, client certs, a service-account key."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.infra.proc import InfraError, run

_DAYS = "3650"


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


class Pki:
    def __init__(self, directory: Path) -> None:
        if shutil.which("openssl") is None:
            raise InfraError("`openssl` is not on PATH; it is needed to create the kube-apiserver PKI")
        self.directory = directory
        self.ca = KeyPair(directory / "ca.crt", directory / "ca.key")

    def ensure_ca(self) -> KeyPair:
        if not self.ca.cert.is_file():
            self.directory.mkdir(parents=True, exist_ok=True)
            run(
                [
                    "openssl",
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    self.ca.key,
                    "-out",
                    self.ca.cert,
                    "-days",
                    _DAYS,
                    "-subj",
                    "/CN=tracker-testenv-ca",
                ],
                what="creating the test CA",
            )
        return self.ca

    def serving(self, name: str, *, ips: tuple[str, ...] = ("127.0.0.1",), dns: tuple[str, ...] = ()) -> KeyPair:
        alt_names = ",".join([*(f"IP:{ip}" for ip in ips), "DNS:localhost", *(f"DNS:{d}" for d in dns)])
        return self._issue(name, f"/CN={name}", f"subjectAltName={alt_names}\nextendedKeyUsage=serverAuth\n")

    def client(self, name: str, *, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client cert the apiserver maps to `user` (CN) in `groups` (O)."""
        subject = "".join(f"/O={group}" for group in groups) + f"/CN={user}"
        return self._issue(name, subject, "extendedKeyUsage=clientAuth\n")

    def service_account_key(self) -> KeyPair:
        """RSA key whose public half verifies, and private half signs, service-account tokens."""
        pair = KeyPair(self.directory / "sa.pub", self.directory / "sa.key")
        if not pair.key.is_file():
            run(["openssl", "genrsa", "-out", pair.key, "2048"], what="creating the service-account key")
            run(["openssl", "rsa", "-in", pair.key, "-pubout", "-out", pair.cert], what="extracting sa.pub")
        return pair

    def _issue(self, name: str, subject: str, extensions: str) -> KeyPair:
        ca = self.ensure_ca()
        pair = KeyPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        if pair.cert.is_file():
            return pair
        csr = self.directory / f"{name}.csr"
        ext = self.directory / f"{name}.ext"
        ext.write_text(extensions)
        run(
            [
                "openssl",
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                pair.key,
                "-out",
                csr,
                "-subj",
                subject,
            ],
            what=f"creating the {name} key",
        )
        run(
            [
                "openssl",
                "x509",
                "-req",
                "-in",
                csr,
                "-CA",
                ca.cert,
                "-CAkey",
                ca.key,
                "-CAcreateserial",
                "-out",
                pair.cert,
                "-days",
                _DAYS,
                "-extfile",
                ext,
            ],
            what=f"signing the {name} certificate",
        )
        csr.unlink()
        ext.unlink()
        return pair
