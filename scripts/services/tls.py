"""The development PKI and credentials the tests use: a CA, server certificates for
PostgreSQL (DNS:localhost only, so 127.0.0.1 is a host-name mismatch a test can use) and
the broker, client certificates, and the broker's SCRAM and PLAIN passwords. Made once
per checkout and never used outside this machine's tests."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from pathlib import Path

from scripts.services.declaration import Service
from scripts.services.host import apt_install, failure, run

# bump when other files are made: existing checkouts then make them all anew
LAYOUT = "2"
# the role a test logs in as with the PostgreSQL client certificate (cert auth maps CN to role)
PG_CERT_USER = "outbox_cert"
SCRAM_USERS = ("relay", "admin")

# name: (subject, subjectAltName, extendedKeyUsage)
_CERTIFICATES = {
    "pg-server": ("/CN=localhost", "DNS:localhost", "serverAuth"),
    "kafka-server": ("/CN=localhost", "DNS:localhost,IP:127.0.0.1", "serverAuth,clientAuth"),
    "kafka-client": ("/CN=outbox-relay-client", "DNS:outbox-relay-client", "clientAuth"),
    "pg-client": (f"/CN={PG_CERT_USER}", f"DNS:{PG_CERT_USER}", "clientAuth"),
}


class DevTls(Service):
    """The files, in a directory only their owner may enter."""

    name = "tls"

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def path(self, name: str) -> Path:
        return self.dir / name

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    def password(self, name: str) -> str:
        """A generated password (``kafka-scram-relay``, ``kafka-plain-relay``, ...)."""
        return (self.dir / f"{name}.password").read_text().strip()

    def digest(self, *names: str) -> str:
        """A digest of these files, for the settings of a service that reads them."""
        digest = hashlib.sha256()
        for name in names:
            digest.update((self.dir / name).read_bytes())
        return digest.hexdigest()[:16]

    def install(self) -> None:
        if shutil.which("openssl") is None:
            apt_install("openssl")

    def settings(self) -> list[str]:
        return [f"layout {LAYOUT}"]

    def running(self) -> bool:
        try:
            return (self.dir / ".complete").read_text().strip() == LAYOUT
        except OSError:
            return False

    def start(self) -> None:
        if self.running():
            return
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, mode=0o700)
        self._openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
            "-subj", "/CN=outbox-relay development CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout", "ca.key", "-out", "ca.pem",
        )  # fmt: skip
        for name, (subject, alt_names, usage) in _CERTIFICATES.items():
            self._issue(name, subject, alt_names, usage)
        server = b"".join(
            (self.dir / part).read_bytes()
            for part in ("kafka-server.key", "kafka-server.crt", "ca.pem")
        )
        (self.dir / "kafka-server.pem").write_bytes(server)
        for name in (*(f"kafka-scram-{user}" for user in SCRAM_USERS), "kafka-plain-relay"):
            (self.dir / f"{name}.password").write_text(secrets.token_urlsafe(18) + "\n")
        for secret in self.dir.iterdir():
            if secret.suffix in (".key", ".password") or secret.name == "kafka-server.pem":
                secret.chmod(0o600)
        (self.dir / ".complete").write_text(LAYOUT + "\n")

    def _issue(self, name: str, subject: str, alt_names: str, usage: str) -> None:
        """NAME.key (PKCS#8) and NAME.crt, signed by the CA."""
        ext = self.dir / f"{name}.ext"
        ext.write_text(
            f"subjectAltName={alt_names}\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n"
        )
        self._openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
            "-keyout", f"{name}.key", "-out", f"{name}.csr",
        )  # fmt: skip
        self._openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "3650", "-extfile", ext.name, "-out", f"{name}.crt",
        )  # fmt: skip
        os.unlink(self.dir / f"{name}.csr")
        ext.unlink()

    def _openssl(self, *args: str) -> None:
        done = run(["openssl", *args], cwd=self.dir, timeout=60)
        if done.returncode != 0:
            raise failure(self.name, f"openssl {args[0]} failed", output=done.stderr)

    def ready(self) -> str | None:
        return None if self.running() else f"{self.dir} is incomplete"

    def stop(self) -> None:
        """Files, not a process: nothing to stop."""

    def env(self) -> dict[str, str]:
        return {}

    def describe(self) -> str:
        return str(self.dir)
