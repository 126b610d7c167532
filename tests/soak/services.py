"""The soak's own PostgreSQL 18 and single-node KRaft Kafka broker, in a temporary directory,
on loopback ports of their own, with the restarts the fault schedule needs.

Nothing here touches the services the rest of the suite shares: the soak restarts its
services, so it must own them. PostgreSQL runs as the ``postgres`` OS user (initdb and
postgres refuse root); both take their binaries from ``scripts/soak.sh prepare``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from tests.services import kafka_cluster_id_script

REPO = Path(__file__).resolve().parents[2]
log = logging.getLogger(__name__)


class ServiceStartError(RuntimeError):
    """A soak service did not come up; the message names its log."""


@dataclass(frozen=True)
class Ports:
    """Every loopback port the soak binds, all below ``base + 500``."""

    base: int

    @property
    def postgres(self) -> int:
        return self.base + 32

    @property
    def kafka(self) -> int:
        return self.base + 92

    @property
    def controller(self) -> int:
        return self.base + 93

    @property
    def kafka_proxied(self) -> int:
        """The broker listener one relay reaches through the fault proxy."""
        return self.base + 94

    @property
    def kafka_proxy(self) -> int:
        """Where the fault proxy listens: the proxied listener's advertised port."""
        return self.base + 194

    def http(self, n: int) -> int:
        """Health listen port of process ``n`` (0: the sidecar, 1..: relays)."""
        return self.base + 300 + n


def prepare() -> tuple[Path, Path]:
    """``scripts/soak.sh prepare``: (PostgreSQL bin dir, Kafka jar dir)."""
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "soak.sh"), "prepare"],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if done.returncode != 0:
        raise ServiceStartError(f"scripts/soak.sh prepare failed: {done.stderr[-2000:]}")
    values = dict(
        line.split("=", 1) for line in done.stdout.splitlines() if line.startswith("SOAK_")
    )
    return Path(values["SOAK_PG_BIN"]), Path(values["SOAK_KAFKA_LIB"])


def _as_postgres(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run(
        [*prefix, *argv], capture_output=True, text=True, check=False, timeout=timeout, cwd="/"
    )


class SoakPostgres:
    """A throw-away PostgreSQL 18 cluster: superuser ``outbox``, trust on loopback only."""

    def __init__(self, bin_dir: Path, root: Path, port: int) -> None:
        self.bin = bin_dir
        self.data = root / "pgdata"
        self.port = port
        self.log_path = root / "postgres.log"
        self.root = root

    @property
    def admin_url(self) -> str:
        return f"postgresql://outbox@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://outbox@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        """initdb and our settings; the directory is the postgres user's."""
        shutil.chown(self.root, "postgres", "postgres")
        self.root.chmod(0o755)
        done = _as_postgres(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "outbox",
            "-E",
            "UTF8",
            "--locale=C",
            "--auth=trust",
        )
        if done.returncode != 0:
            raise ServiceStartError(f"initdb failed: {done.stderr[-2000:]}")
        settings = "\n".join(
            [
                f"port = {self.port}",
                "listen_addresses = '127.0.0.1'",
                f"unix_socket_directories = '{self.root}'",
                "max_connections = 200",
                # The soak restarts the server only cleanly (fast shutdown), which writes
                # everything out; skipping fsync spares a busy machine's disk.
                "fsync = off",
                "full_page_writes = off",
                "log_min_messages = warning",
            ]
        )
        extra = self.data / "soak.conf"
        _as_postgres("sh", "-c", f"printf '%s\\n' \"$0\" > '{extra}'", settings)
        _as_postgres(
            "sh", "-c", f"echo \"include_if_exists = 'soak.conf'\" >> '{self.data}/postgresql.conf'"
        )

    def start(self) -> None:
        done = _as_postgres(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log_path),
            "-w",
            "-t",
            "120",
            "start",
            timeout=180,
        )
        if done.returncode != 0:
            raise ServiceStartError(f"postgres did not start; see {self.log_path}")

    def stop(self, mode: str = "fast") -> None:
        _as_postgres(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop"
        )

    def pids(self) -> list[int]:
        """The postmaster and its children (for memory accounting)."""
        try:
            master = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        children = Path(f"/proc/{master}/task/{master}/children")
        try:
            return [master, *(int(p) for p in children.read_text().split())]
        except OSError:
            return [master]


class SoakKafka:
    """A single-node KRaft broker: a plain listener for everyone and one listener whose
    advertised address is the fault proxy's, for the relay whose path the schedule breaks."""

    def __init__(self, lib: Path, root: Path, ports: Ports) -> None:
        self.lib = lib
        self.dir = root / "kafka"
        self.ports = ports
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.ports.kafka}"

    @property
    def proxy_route(self) -> tuple[str, str]:
        """(proxy listen address, broker listener behind it)."""
        return f"127.0.0.1:{self.ports.kafka_proxy}", f"127.0.0.1:{self.ports.kafka_proxied}"

    def _java(self) -> list[str]:
        return [
            "java",
            "-Xms128m",
            "-Xmx512m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={self.dir / 'logs'}",
            f"-Dlog4j2.configurationFile={REPO / 'scripts' / 'kafka' / 'log4j2.properties'}",
            "-cp",
            f"{self.lib}/*",
        ]

    def init(self) -> None:
        """server.properties and ``kafka-storage format``."""
        p = self.ports
        (self.dir / "logs").mkdir(parents=True)
        data = self.dir / "data"
        properties = "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@127.0.0.1:{p.controller}",
                "controller.listener.names=CONTROLLER",
                f"listeners=PLAINTEXT://127.0.0.1:{p.kafka},CONTROLLER://127.0.0.1:{p.controller},"
                f"PROXY0://127.0.0.1:{p.kafka_proxied}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{p.kafka},"
                f"PROXY0://127.0.0.1:{p.kafka_proxy}",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PROXY0:PLAINTEXT",
                f"log.dirs={data}",
                f"metadata.log.dir={data}",
                "auto.create.topics.enable=true",
                "num.partitions=6",
                "default.replication.factor=1",
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=3",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "min.insync.replicas=1",
                "group.initial.rebalance.delay.ms=0",
                "num.network.threads=2",
                "num.io.threads=2",
                "log.retention.hours=24",
            ]
        )
        (self.dir / "server.properties").write_text(properties + "\n")
        # drawn again when it would start with "-", which the storage tool reads as an option
        cluster_id = kafka_cluster_id_script().cluster_id()
        done = subprocess.run(
            [
                *self._java(),
                "kafka.tools.StorageTool",
                "format",
                "-t",
                cluster_id,
                "-c",
                str(self.dir / "server.properties"),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        if done.returncode != 0:
            raise ServiceStartError(
                f"kafka storage format failed (exit {done.returncode}): "
                f"{(done.stdout + done.stderr)[-1000:]}"
            )

    def start(self) -> None:
        """Start the broker process (answering is awaited by :func:`wait_kafka`)."""
        with (self.dir / "stdout.log").open("ab") as out:
            self.process = subprocess.Popen(
                [*self._java(), "kafka.Kafka", str(self.dir / "server.properties")],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
            )

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL when it does not end in time."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)

    @property
    def pid(self) -> int | None:
        return None if self.process is None or self.process.poll() is not None else self.process.pid


async def wait_postgres(url: str, timeout: float = 120) -> None:
    """Until a login works."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = await asyncpg.connect(url, timeout=5)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            if time.monotonic() > deadline:
                raise ServiceStartError("postgres did not accept logins") from None
            await _sleep(0.5)
            continue
        await conn.close()
        return


async def wait_kafka(bootstrap: str, timeout: float = 180) -> None:
    """Until the broker answers a metadata request naming itself."""
    from aiokafka.client import AIOKafkaClient

    deadline = time.monotonic() + timeout
    while True:
        client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        try:
            await client.bootstrap()
            metadata = await client.fetch_all_metadata()
            if metadata.brokers():
                return
        except Exception:  # any failure means "not yet"
            if time.monotonic() > deadline:
                raise ServiceStartError("kafka did not answer") from None
        finally:
            await client.close()
        await _sleep(1.0)


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


class SoakServices:
    """Both services in one temporary directory; ``close`` stops them and removes it."""

    def __init__(self, ports: Ports) -> None:
        self.ports = ports
        self.root = Path(tempfile.mkdtemp(prefix="outbox-relay-soak-"))
        self.root.chmod(0o755)  # the postgres user must reach its data directory
        pg_bin, kafka_lib = prepare()
        self.postgres = SoakPostgres(pg_bin, self.root / "pg", ports.postgres)
        self.kafka = SoakKafka(kafka_lib, self.root, ports)

    async def start(self) -> None:
        (self.root / "pg").mkdir()
        self.postgres.init()
        self.postgres.start()
        self.kafka.init()
        self.kafka.start()
        await wait_postgres(self.postgres.admin_url)
        await wait_kafka(self.kafka.bootstrap)

    def close(self, keep: bool = False) -> None:
        with contextlib.suppress(Exception):
            self.kafka.stop()
        with contextlib.suppress(Exception):
            self.postgres.stop("immediate")
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)
