"""What every service declares once, and how the orchestrator waits for one to answer."""

from __future__ import annotations

import abc
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from scripts.services.host import ServiceError, failure, log_reason

log = logging.getLogger("services")


def fingerprint(settings: Sequence[str]) -> str:
    """One digest of everything a service is started with: equal digests, equal settings."""
    digest = hashlib.sha256()
    for line in settings:
        digest.update(line.encode())
        digest.update(b"\n")
    return digest.hexdigest()


class Service(abc.ABC):
    """One service: what it installs, its settings, how it starts, is checked and stops.

    ``settings`` lists everything a running process of it was started with (configuration
    files, binaries' versions, certificates' digests); the orchestrator restarts one of ours
    whose settings changed. ``ready`` is the probe a test would make.
    """

    name: str
    #: services that must answer first (started with it by ``up``)
    needs: tuple[str, ...] = ()
    #: how long ``up`` waits for it to answer after it was started
    wait_s: float = 60.0
    #: the environment variable that may name an external server to use instead
    address_variable: str | None = None

    @abc.abstractmethod
    def install(self) -> None:
        """Install what it runs on (apt, pip, Maven) when it is missing."""

    @abc.abstractmethod
    def settings(self) -> list[str]:
        """Everything it is started with; a running one with other settings is restarted."""

    @abc.abstractmethod
    def running(self) -> bool:
        """True when this checkout's instance of it runs."""

    @abc.abstractmethod
    def start(self) -> None:
        """Write its files and start it; ``ready`` tells when it answers."""

    @abc.abstractmethod
    def ready(self) -> str | None:
        """None when it answers at its address, else why not (one line)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop this checkout's instance (nothing when none runs)."""

    @abc.abstractmethod
    def env(self) -> dict[str, str]:
        """The lines it contributes to ``.services/env``."""

    def env_keys(self) -> set[str]:
        """Every variable it may write to ``.services/env``."""
        return set(self.env())

    def address(self) -> str:
        """Where tests reach it ("" for a service without an address)."""
        return ""

    def probe(self, address: str) -> str | None:
        """``ready`` for another instance at ``address`` (an external server)."""
        return None

    def pid(self) -> int | None:
        """Its process, when it is one and runs."""
        return None

    def ports(self) -> list[int]:
        """The ports it binds, which must be free before it starts."""
        return []

    def log_file(self) -> Path | None:
        """The log that says why it failed to start."""
        return None

    def progress(self) -> str | None:
        """A marker that changes while it is busy coming up (e.g. logs loaded so far)."""
        return None

    def describe(self) -> str:
        """Details for the status line."""
        return ""


def wait_until_ready(
    service: Service,
    *,
    wait_s: float | None = None,
    pause_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Until ``service`` answers. Fails at once when its process is gone, and ``wait_s`` after
    its progress marker last moved (a broker recovering its logs takes minutes and says so)."""
    limit = service.wait_s if wait_s is None else wait_s
    deadline = clock() + limit
    seen = service.progress()
    said = clock() - 10
    why: str | None = "not probed yet"
    while True:
        why = service.ready()
        if why is None:
            return
        if not service.running():
            raise failure(service.name, "exited while starting", log_file=service.log_file())
        now = service.progress()
        if now is not None and now != seen:
            seen = now
            deadline = clock() + limit
            if clock() - said >= 10:
                log.info("%s: still coming up (%s)", service.name, now)
                said = clock()
        if clock() >= deadline:
            break
        sleep(pause_s)
    log_file = service.log_file()
    where = f" (log: {log_file})" if log_file else ""
    raise ServiceError(
        f"{service.name}: did not answer within {limit:.0f}s ({why}); "
        f"its log: {log_reason(log_file)}{where}"
    )
