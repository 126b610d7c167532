"""What the services need from the machine: commands as root or as the ``postgres`` OS user,
Debian packages, processes, the ports they listen on, and the one line of a log that says
why something failed."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

log = logging.getLogger("services")

POSTGRES_USER = "postgres"


class ServiceError(Exception):
    """A service could not be installed, started or stopped; the message is one line."""


# -- the one line that says why --------------------------------------------------------------

_REASON_MARKERS = (
    "FATAL",
    "PANIC",
    "ERROR",
    "Exception",
    "error:",
    "Error:",
    "cannot",
    "could not",
)
_LINE_LIMIT = 300


def reason_in(text: str) -> str:
    """The line of a log tail that says why: the last one naming an error, else the last one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if any(marker in line for marker in _REASON_MARKERS):
            return line[:_LINE_LIMIT]
    return lines[-1][:_LINE_LIMIT] if lines else ""


def read_tail(path: Path, size: int = 16384) -> str:
    """The end of a file, read as root when it belongs to another user; empty if absent."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - size, 0))
            return f.read().decode(errors="replace")
    except PermissionError:
        done = run(privileged(["tail", "-c", str(size), str(path)]), timeout=10)
        return done.stdout if done.returncode == 0 else ""
    except OSError:
        return ""


def log_reason(log_file: Path | None) -> str:
    """The line of a log's tail that says why, or that the log says nothing."""
    reason = reason_in(read_tail(log_file)) if log_file else ""
    return reason or "no log output"


def failure(
    service: str, what: str, *, output: str = "", log_file: Path | None = None
) -> ServiceError:
    """``service: what: <the line that says why>``, from a command's output or a log's tail."""
    reason = reason_in(output) or log_reason(log_file)
    where = f" (log: {log_file})" if log_file else ""
    return ServiceError(f"{service}: {what}: {reason}{where}")


# -- commands --------------------------------------------------------------------------------


def run(
    argv: Sequence[str],
    *,
    timeout: float = 120,
    input_text: str | None = None,
    cwd: Path | str = "/",
) -> subprocess.CompletedProcess[str]:
    """A command to its end, output captured; a command that cannot run is exit 127."""
    try:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            input=input_text,
            stdin=None if input_text is not None else subprocess.DEVNULL,
            cwd=cwd,
        )
    except FileNotFoundError as exc:
        return subprocess.CompletedProcess(list(argv), 127, "", f"error: {exc}")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(
            list(argv), 124, "", f"error: {argv[0]} did not finish in {timeout:.0f}s"
        )


def is_root() -> bool:
    return os.geteuid() == 0


def privileged(argv: Sequence[str]) -> list[str]:
    """``argv`` as root: directly when we are root, else through ``sudo -n``."""
    return list(argv) if is_root() else ["sudo", "-n", *argv]


def as_postgres(argv: Sequence[str]) -> list[str]:
    """``argv`` as the postgres OS user: initdb, postgres and PgBouncer refuse root."""
    if is_root():
        return ["runuser", "-u", POSTGRES_USER, "--", *argv]
    if pwd.getpwuid(os.geteuid()).pw_name == POSTGRES_USER:
        return list(argv)
    return ["sudo", "-n", "-u", POSTGRES_USER, "--", *argv]


def postgres_can(test: str, path: Path) -> bool:
    """``test -<test> path`` as the postgres user (``x``: may run it, ``w``: may write it)."""
    return run(as_postgres(["test", f"-{test}", str(path)]), timeout=10).returncode == 0


# -- packages and the postgres user ----------------------------------------------------------

_apt_updated = False


def apt_install(*packages: str) -> None:
    """Install Debian packages (the index is updated once per run)."""
    global _apt_updated
    if shutil.which("apt-get") is None:
        raise ServiceError(f"no apt-get on this machine: install {' '.join(packages)} by hand")
    env = ["env", "DEBIAN_FRONTEND=noninteractive"]
    lock = ["-o", "DPkg::Lock::Timeout=600"]
    if not _apt_updated:
        log.info("installing with apt: %s", " ".join(packages))
        done = run(privileged([*env, "apt-get", *lock, "update", "-q"]), timeout=900)
        if done.returncode != 0:
            raise failure("apt", "apt-get update failed", output=done.stdout + done.stderr)
        _apt_updated = True
    done = run(
        privileged(
            [
                *env,
                "apt-get",
                *lock,
                "-o",
                "Dpkg::Options::=--force-confdef",
                "-o",
                "Dpkg::Options::=--force-confold",
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                *packages,
            ]
        ),
        timeout=1800,
    )
    if done.returncode != 0:
        raise failure(
            "apt", f"apt-get install {' '.join(packages)} failed", output=done.stdout + done.stderr
        )


def ensure_postgres_user() -> None:
    """The postgres OS user, made (with its home) when the machine has none."""
    try:
        pwd.getpwnam(POSTGRES_USER)
        return
    except KeyError:
        pass
    log.info("creating the OS user %s", POSTGRES_USER)
    argv = ["useradd", "--system", "--user-group", "--home-dir", "/var/lib/postgresql"]
    done = run(privileged([*argv, "--create-home", "--shell", "/bin/bash", POSTGRES_USER]))
    if done.returncode != 0:
        raise failure("postgres user", "useradd failed", output=done.stderr)


def make_postgres_dir(path: Path, mode: int = 0o700) -> None:
    """A directory owned by the postgres user (its parents as they are or made by root)."""
    done = run(
        privileged(
            [
                "install",
                "-d",
                "-o",
                POSTGRES_USER,
                "-g",
                POSTGRES_USER,
                "-m",
                f"{mode:o}",
                str(path),
            ]
        )
    )
    if done.returncode != 0:
        raise failure("postgres files", f"cannot make {path}", output=done.stderr)


def write_postgres_file(path: Path, text: str | bytes, mode: int = 0o600) -> None:
    """A file owned by the postgres user with exactly this content."""
    data = text.encode() if isinstance(text, str) else text
    with tempfile.NamedTemporaryFile(prefix="outbox-relay-", delete=False) as tmp:
        tmp.write(data)
    try:
        done = run(
            privileged(
                [
                    "install",
                    "-o",
                    POSTGRES_USER,
                    "-g",
                    POSTGRES_USER,
                    "-m",
                    f"{mode:o}",
                    tmp.name,
                    str(path),
                ]
            )
        )
    finally:
        os.unlink(tmp.name)
    if done.returncode != 0:
        raise failure("postgres files", f"cannot write {path}", output=done.stderr)


def read_file(path: Path) -> str | None:
    """A file's text, read as root when it belongs to another user; None if absent."""
    try:
        return path.read_text()
    except PermissionError:
        done = run(privileged(["cat", str(path)]), timeout=10)
        return done.stdout if done.returncode == 0 else None
    except (FileNotFoundError, NotADirectoryError):
        return None


def remove_tree(path: Path) -> None:
    """``rm -rf`` as root (the postgres user's files included)."""
    if path.exists() or path.is_symlink():
        done = run(privileged(["rm", "-rf", "--one-file-system", str(path)]), timeout=300)
        if done.returncode != 0:
            raise failure("cleanup", f"cannot remove {path}", output=done.stderr)


# -- processes -------------------------------------------------------------------------------


def alive(pid: int | None) -> bool:
    """True while the process runs (a zombie, ended but not yet reaped, does not)."""
    if not pid or pid <= 0:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def command_line(pid: int) -> str:
    """The process's arguments joined by spaces ("" once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def pid_from_file(path: Path, *, command_has: Iterable[str]) -> int | None:
    """The live pid a pid file names, if that process's command line has every given part
    (a pid reused by an unrelated process since does not count)."""
    text = read_file(path)
    if not text:
        return None
    first = text.split("\n", 1)[0].strip()
    if not first.isdigit():
        return None
    pid = int(first)
    line = command_line(pid)
    if alive(pid) and all(part in line for part in command_has):
        return pid
    return None


def terminate(pid: int, *, grace_s: float, service: str) -> None:
    """SIGTERM, then SIGKILL when it has not ended after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(pid):
        log.warning("%s: pid %d did not stop in %.0fs, killing it", service, pid, grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while alive(pid) and time.monotonic() < deadline + 10:
            time.sleep(0.1)


# -- who listens on a port -------------------------------------------------------------------

_LISTEN = "0A"


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_address)
    # /proc/net/tcp{,6} print each 32-bit word in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return ipaddress.IPv4Address(words)
    address = ipaddress.IPv6Address(words)
    return address.ipv4_mapped or address


def listening_sockets(
    proc_net_tcp: str,
) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int, int]]:
    """(address, port, socket inode) of every listening socket in a /proc/net/tcp{,6} text."""
    found = []
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        host, _, port = fields[1].partition(":")
        found.append((_address(host), int(port, 16), int(fields[9])))
    return found


def _host_addresses(host: str) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return {ipaddress.ip_address(host)}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return set()
    return {ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos}


def listener_inodes(port: int, host: str | None = None) -> set[int]:
    """The inodes of the sockets listening on ``port`` (on ``host``'s address or on all)."""
    wanted = _host_addresses(host) if host else set()
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            text = Path(table).read_text()
        except OSError:
            continue
        for address, bound, inode in listening_sockets(text):
            if bound != port:
                continue
            if not wanted or address.is_unspecified or address in wanted:
                inodes.add(inode)
    return inodes


def pids_holding(inodes: set[int]) -> list[int]:
    """The processes that hold any of these sockets open (all of them when run as root)."""
    if not inodes:
        return []
    links = {f"socket:[{inode}]" for inode in inodes}
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in links:
                    pids.append(int(entry))
                    break
            except OSError:
                continue
    return sorted(pids)


def pid_listening_on(address: str) -> int | None:
    """The process listening on ``host:port``: a service found by the address it was given,
    never as the only process of its kind. None when nothing here listens there."""
    host, _, port = address.rpartition(":")
    pids = pids_holding(listener_inodes(int(port), host.strip("[]") or None))
    # a listener's forked children may share its socket: the one that bound it is the one
    # whose parent is not among them
    roots = [pid for pid in pids if parent_of(pid) not in pids]
    return roots[0] if roots else None


def parent_of(pid: int) -> int | None:
    """The parent's pid (None once the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[-1].split()[1])


def port_taken_by(port: int) -> str | None:
    """Who listens on ``port`` (any address), as ``pid N (command)``; None if nobody does."""
    inodes = listener_inodes(port)
    if not inodes:
        return None
    pids = pids_holding(inodes)
    if not pids:
        return "a process this user cannot see"
    return f"pid {pids[0]} ({command_line(pids[0])[:120]})"
