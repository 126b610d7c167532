"""What the PostgreSQL driver will be given, checked before any connection is tried.

A setting the driver refuses, or a certificate file it cannot load, fails every attempt
the same way; refused when the settings are read, it is one line and exit 2 instead of a
loop that retries for ever or a health report that blames the network. Pure: reads the
URL, the environment it is handed and the files they name, and never connects.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from contracts.errors import ConfigError

_SCHEMES = frozenset({"postgres", "postgresql"})

# Said whenever a URL's parts cannot be told apart: the fix is always the same.
_ENCODE_HINT = (
    "percent-encode reserved characters in the user name and password "
    "(/ %2F, @ %40, : %3A, % %25, # %23, ? %3F)"
)
_AUTHORITY_END = re.compile(r"[/?#]")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_NOT_A_URL = "--database-url is not a valid postgresql:// URL"
_PORT_OUT_OF_RANGE = "--database-url has a port outside 1-65535"


def validate_database_url(url: str | None) -> str | None:
    """Check the shape of a ``postgresql://`` URL without ever echoing it; None means libpq PG* variables.

    A raw ``/``, ``?``, ``#`` or ``@`` in a password moves the rest of it into the host,
    port or database name, which messages do show; such a URL is refused instead, as is a
    ``%`` that starts no escape (libpq refuses both too).
    """
    if url is None or url == "":
        return None
    scheme, separator, rest = url.partition("://")
    if not separator or scheme.lower() not in _SCHEMES:
        raise ConfigError("--database-url must start with postgresql:// or postgres://")
    cut = _AUTHORITY_END.search(rest)
    authority, after = (rest[: cut.start()], rest[cut.start() :]) if cut else (rest, "")
    if "@" in after or authority.count("@") > 1:
        raise ConfigError(f"{_NOT_A_URL}: {_ENCODE_HINT}")
    userinfo = authority.rpartition("@")[0]
    if _BAD_ESCAPE.search(userinfo):
        raise ConfigError(f"{_NOT_A_URL}: {_ENCODE_HINT}")
    try:
        url.encode()  # bytes that were not UTF-8 (kept as surrogates) cannot be sent
        unquote(userinfo, errors="strict")
        parts = urlsplit(url)
        port = parts.port  # raises ValueError on a non-numeric port
    except ValueError as exc:  # Unicode errors too: an escape or a raw byte that is not UTF-8
        host_port = authority.rpartition("@")[2]
        # after "]:" for an IPv6 literal, else after the last ":"
        _, colon, port_text = (
            host_port.partition("]:") if "[" in host_port else host_port.rpartition(":")
        )
        if colon and port_text.isascii() and port_text.isdigit():  # a port, only out of range
            raise ConfigError(_PORT_OUT_OF_RANGE) from exc
        raise ConfigError(_NOT_A_URL) from exc
    if port is not None and not 0 < port < 65536:
        raise ConfigError(_PORT_OUT_OF_RANGE)
    for name, values in parse_qs(parts.query).items():
        if name == "port" and any(_port_list(value) is None for value in values):
            raise ConfigError(f"--database-url port {_PORTS}")
        allowed = _QUERY_CHOICES.get(name)
        if allowed is not None and any(value not in allowed for value in values):
            raise ConfigError(f"--database-url {name} must be one of {', '.join(allowed)}")
    return url


# The URL parameters whose value the driver checks against a list when it connects: a bad
# one would fail every attempt, so it is refused when the settings are read (the value is
# not echoed: the message names the parameter only).
_QUERY_CHOICES: Mapping[str, tuple[str, ...]] = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "target_session_attrs": (
        "any",
        "primary",
        "standby",
        "prefer-standby",
        "read-write",
        "read-only",
    ),
    "gsslib": ("gssapi", "sspi"),
    "ssl_min_protocol_version": ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"),
    "ssl_max_protocol_version": ("TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3"),
    "sslnegotiation": ("postgres", "direct"),
}


# -- what the driver reads beyond the URL ----------------------------------------------------
# A URL parameter → the PG* variable the driver reads in its place when the URL does not
# set it (the URL wins, as in libpq).
_VARIABLES: Mapping[str, str] = {
    "sslmode": "PGSSLMODE",
    "target_session_attrs": "PGTARGETSESSIONATTRS",
    "gsslib": "PGGSSLIB",
    "ssl_min_protocol_version": "PGSSLMINPROTOCOLVERSION",
    "ssl_max_protocol_version": "PGSSLMAXPROTOCOLVERSION",
    "sslnegotiation": "PGSSLNEGOTIATION",
    "sslrootcert": "PGSSLROOTCERT",
    "sslcrl": "PGSSLCRL",
    "sslcert": "PGSSLCERT",
    "sslkey": "PGSSLKEY",
}
# Variables the driver takes as unset when they are empty; an empty one of the others is
# a value like any other, and none of the choices.
_EMPTY_IS_UNSET = frozenset({"PGSSLMINPROTOCOLVERSION", "PGSSLMAXPROTOCOLVERSION"})
_SSLMODES = _QUERY_CHOICES["sslmode"]
_REQUIRE = _SSLMODES.index("require")
# The hosts the driver tries when neither the URL nor PGHOST names one: socket
# directories, then localhost over TCP.
_DEFAULT_HOSTS = (
    "/run/postgresql",
    "/var/run/postgresql",
    "/tmp",  # noqa: S108 - a socket directory the driver looks in, not a file of ours
    "/private/tmp",
    "localhost",
)


class _Given:
    """The URL's parameters and the environment, read the way the driver reads them."""

    def __init__(self, url: str | None, environ: Mapping[str, str]) -> None:
        parts = urlsplit(url or "")
        self.query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
        netloc = parts.netloc.rpartition("@")[2]
        self.netloc_hosts = [unquote(host) for host, _ in _host_list(netloc) if host]
        # Whether a host of the URL's own has no port, which PGPORT then supplies.
        self.netloc_portless = any(host and not port for host, port in _host_list(netloc))
        self.environ = environ

    def value(self, name: str) -> tuple[str | None, str]:
        """A parameter's value (None: not given) and where it came from, for messages."""
        if name in self.query:
            return self.query[name], f"--database-url {name}"
        variable = _VARIABLES[name]
        value = self.environ.get(variable)
        if value == "" and variable in _EMPTY_IS_UNSET:
            value = None
        return value, variable

    def hosts(self) -> list[str]:
        if self.netloc_hosts:
            return self.netloc_hosts
        for given in (self.query.get("host"), self.environ.get("PGHOST")):
            if given:
                return [host for host, _ in _host_list(given)]
        return list(_DEFAULT_HOSTS)

    def reads_pgport(self) -> bool:
        # The driver parses PGPORT while it parses the URL's host list, and again at the
        # end when nothing gave a port; a port in the query settles it only when the URL
        # names no host of its own.
        return bool(self.netloc_hosts) or "port" not in self.query

    def uses_pgport(self) -> bool:
        """Whether some host is tried at a port PGPORT gives."""
        return self.netloc_portless if self.netloc_hosts else "port" not in self.query


def _host_list(spec: str) -> list[tuple[str, str]]:
    """(host, port) of each entry of a comma-separated host[:port] list; port may be ""."""
    hosts = []
    for hostspec in spec.split(","):
        if hostspec.startswith("["):
            host, _, rest = hostspec[1:].partition("]")
            hosts.append((host, rest.removeprefix(":")))
        elif hostspec.startswith("/"):
            hosts.append((hostspec, ""))
        else:
            host, _, port = hostspec.partition(":")
            hosts.append((host, port))
    return hosts


_PORTS = "must be a port 1-65535 or a comma-separated list of them"


def _port_list(spec: str, *, in_range: bool = True) -> list[int] | None:
    """The ports of a comma-separated list, or None when one is not a port number (or,
    ``in_range``, outside 1-65535)."""
    ports = []
    for part in spec.split(","):
        text = part.strip()
        if not (text.isascii() and text.isdigit()) or (in_range and not 0 < int(text) < 65536):
            return None
        ports.append(int(text))
    return ports


def check_driver_settings(
    url: str | None, environ: Mapping[str, str], *, home: Path | None = None
) -> None:
    """Refuse what the driver would refuse at every connection attempt.

    That is: a PG* variable the URL leaves in charge whose value is none of its choices, a
    PGPORT that is not a port list matching the hosts, direct TLS negotiation without
    ``sslmode`` require or stronger, and a certificate, key, root certificate or CRL file
    (named by the URL or a PG* variable, or the default one under ``~/.postgresql``) that
    the driver would fail to load, including verify-ca and verify-full without any root
    certificate. ``url`` has passed :func:`validate_database_url`. Messages name the
    parameter or variable, never its value or a path.
    """
    given = _Given(url, environ)
    for name, allowed in _QUERY_CHOICES.items():
        value, source = given.value(name)
        if value is not None and source == _VARIABLES[name] and value not in allowed:
            raise ConfigError(f"{source} must be one of {', '.join(allowed)}")
    pgport = environ.get("PGPORT")
    if pgport and given.reads_pgport():
        # Parsed whenever read; its range matters only where a host is tried at it.
        ports = _port_list(pgport, in_range=given.uses_pgport())
        if ports is None:
            raise ConfigError(f"PGPORT {_PORTS}")
        hosts = len(given.hosts())
        if len(ports) > 1 and len(ports) != hosts:
            raise ConfigError(f"PGPORT lists {len(ports)} ports for {hosts} host(s)")
    mode = _sslmode(given)
    rank = _SSLMODES.index(mode)
    negotiation, source = given.value("sslnegotiation")
    if negotiation == "direct" and rank < _REQUIRE:
        raise ConfigError(f"{source} direct needs sslmode require, verify-ca or verify-full")
    if mode != "disable":
        _TlsFiles(given, home if home is not None else _home(environ)).load(rank)


def _sslmode(given: _Given) -> str:
    """The sslmode the driver uses: the URL's, else PGSSLMODE, else prefer when some host is
    reached over TCP (disable for sockets only)."""
    mode, _ = given.value("sslmode")
    if mode is None:
        mode = "prefer" if any(not h.startswith("/") for h in given.hosts()) else "disable"
    return mode


VERIFYING_SSLMODES = ("verify-ca", "verify-full")
"""The sslmodes under which the driver verifies the server's certificate."""


@dataclass(frozen=True)
class Transport:
    """How the driver reaches PostgreSQL for one URL and environment."""

    tcp_hosts: tuple[str, ...]
    """The hosts it may reach over TCP (a socket directory is not one of them)."""
    sslmode: str

    @property
    def verified(self) -> bool:
        """True when every TCP connection verifies the server's certificate."""
        return not self.tcp_hosts or self.sslmode in VERIFYING_SSLMODES


def transport(url: str | None, environ: Mapping[str, str]) -> Transport:
    """Which hosts the driver reaches over TCP for ``url`` (or the PG* variables), and
    under which sslmode; pure. ``url`` has passed :func:`validate_database_url`. Settings
    from a connection service file (``PGSERVICE``) are not read."""
    given = _Given(url, environ)
    tcp = tuple(host for host in given.hosts() if not host.startswith("/"))
    return Transport(tcp_hosts=tcp, sslmode=_sslmode(given))


def _home(environ: Mapping[str, str]) -> Path | None:
    if environ.get("HOME"):
        return Path(environ["HOME"])
    try:
        return Path.home()
    except (RuntimeError, KeyError):
        return None


class _TlsFiles:
    """Loads the files the driver would load for one ``sslmode``, into a context of its own."""

    def __init__(self, given: _Given, home: Path | None) -> None:
        self.given = given
        self.home = home
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)

    def file(self, name: str, filename: str) -> tuple[str, str] | None:
        """The file a parameter (or its variable) names, else the default one under
        ``~/.postgresql`` if it exists, with where it came from; None: neither."""
        named, source = self.given.value(name)
        if named:
            return named, source
        if self.home is None:
            return None
        default = (self.home / ".postgresql" / filename).resolve()
        return (str(default), f"~/.postgresql/{filename}") if default.exists() else None

    def load(self, rank: int) -> None:
        if rank >= _REQUIRE:
            root = self.file("sslrootcert", "root.crt")
            if root is not None:
                self.attempt(root[1], lambda: self.context.load_verify_locations(cafile=root[0]))
            elif rank > _REQUIRE:
                raise ConfigError(
                    "sslmode verify-ca and verify-full need a root certificate: name one with "
                    "sslrootcert (PGSSLROOTCERT) or put it at ~/.postgresql/root.crt"
                )
            crl = self.file("sslcrl", "root.crl")
            if crl is not None:
                self.attempt(crl[1], lambda: self.context.load_verify_locations(cafile=crl[0]))
        cert = self.file("sslcert", "postgresql.crt")
        if cert is not None:
            key = self.file("sslkey", "postgresql.key")
            password = self.given.query.get("sslpassword", "")
            self.attempt(
                f"{cert[1]} (or its key)",
                lambda: self.context.load_cert_chain(
                    cert[0], keyfile=key and key[0], password=lambda: password
                ),
            )

    @staticmethod
    def attempt(source: str, load: Callable[[], object]) -> None:
        try:
            load()
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                f"the PostgreSQL TLS file named by {source} could not be loaded "
                f"({_load_failure(exc)})"
            ) from None


def _load_failure(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):  # before OSError, which it is too
        return "not PEM the driver can use, or a key that does not match or is encrypted"
    return type(exc).__name__
