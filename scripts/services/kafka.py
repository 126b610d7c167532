"""A single-node Apache Kafka broker (KRaft, combined mode) from Maven Central's jars.

``scripts/kafka/pom.xml`` pins the version and fetches the jars (``mvn
dependency:copy-dependencies``); ``scripts/kafka/log4j2.properties`` sends the broker's log
to a file. The broker's configuration is declared here, from the port plan: a plain
listener, fault-proxy listeners whose advertised port is where a test's proxy listens,
and (for the development broker) SASL_SSL and SSL listeners on the development PKI with
the standard authorizer.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scripts.services.declaration import Service
from scripts.services.host import (
    alive,
    apt_install,
    command_line,
    failure,
    pid_from_file,
    pid_listening_on,
    run,
    terminate,
)
from scripts.services.plan import PortPlan
from scripts.services.probes import kafka_answer
from scripts.services.tls import SCRAM_USERS, DevTls

log = logging.getLogger("services")

SOURCES = Path(__file__).resolve().parents[1] / "kafka"
POM = SOURCES / "pom.xml"
LOG4J2 = SOURCES / "log4j2.properties"
WAIT_VARIABLE = "KAFKA_WAIT_SECONDS"


def cluster_id(draw: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A random KRaft cluster id, as Kafka's ``Uuid.randomUuid()`` makes it: URL-safe base64
    without padding, drawn again when it starts with ``-``, which the storage tool's
    argument parser would read as an option (one draw in 64)."""
    while True:
        text = base64.urlsafe_b64encode(draw()).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def kafka_version(pom: Path = POM) -> str:
    """The pinned Apache Kafka version."""
    found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom.read_text())
    if not found:
        raise failure("kafka", "no <kafka.version>", output=str(pom))
    return found.group(1)


@dataclass(frozen=True)
class KafkaProfile:
    """How big the broker is and which listeners it has beyond the plain one."""

    heap_min: str = "256m"
    heap_max: str = "1g"
    network_threads: int = 3
    io_threads: int = 4
    internal_topic_partitions: int = 6
    proxies: int = 3
    secured: bool = True  # SASL_SSL and SSL listeners, and the authorizer


DEV_PROFILE = KafkaProfile()


def listeners(ports: PortPlan, profile: KafkaProfile) -> list[tuple[str, int, int | None]]:
    """(name, bound port, advertised port) of every listener; the controller is not advertised."""
    found: list[tuple[str, int, int | None]] = [
        ("PLAINTEXT", ports.kafka, ports.kafka),
        ("CONTROLLER", ports.kafka_controller, None),
    ]
    for n in range(profile.proxies):
        advertised, bound = ports.kafka_proxy(n)
        found.append((f"PROXY{n}", bound, advertised))
    if profile.secured:
        found += [
            ("SASL_SSL", ports.kafka_sasl_ssl, ports.kafka_sasl_ssl),
            ("SSL", ports.kafka_ssl, ports.kafka_ssl),
        ]
    return found


def proxy_routes(ports: PortPlan, profile: KafkaProfile) -> str:
    """``KAFKA_PROXY_ROUTES``: ``advertised>bound`` for every fault-proxy listener."""
    return ",".join(
        f"127.0.0.1:{advertised}>127.0.0.1:{bound}"
        for name, bound, advertised in listeners(ports, profile)
        if name.startswith("PROXY")
    )


def server_properties(
    ports: PortPlan, data: Path, profile: KafkaProfile, tls: DevTls | None
) -> list[str]:
    """The broker's whole server.properties."""
    named = listeners(ports, profile)
    protocol = {"SASL_SSL": "SASL_SSL", "SSL": "SSL"}
    lines = [
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{ports.kafka_controller}",
        "controller.listener.names=CONTROLLER",
        "listeners=" + ",".join(f"{name}://127.0.0.1:{bound}" for name, bound, _ in named),
        "advertised.listeners="
        + ",".join(f"{name}://127.0.0.1:{adv}" for name, _, adv in named if adv is not None),
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map="
        + ",".join(f"{name}:{protocol.get(name, 'PLAINTEXT')}" for name, _, _ in named),
    ]
    if profile.secured:
        if tls is None:
            raise ValueError("SASL_SSL and SSL listeners need the development TLS files")
        plain = tls.password("kafka-plain-relay")
        lines += [
            # SCRAM-SHA-512 users are made at format time; PLAIN users are listed here
            "sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "listener.name.sasl_ssl.plain.sasl.jaas.config="
            f'org.apache.kafka.common.security.plain.PlainLoginModule required user_relay-plain="{plain}";',
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={tls.path('kafka-server.pem')}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={tls.ca}",
            "listener.name.ssl.ssl.client.auth=required",
            # ACLs bind authenticated principals only: PLAINTEXT clients and the controller
            # are User:ANONYMOUS, a super user, so tests that ask for no ACLs are unaffected
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found=false",
            "super.users=User:ANONYMOUS;User:admin",
        ]
    partitions = profile.internal_topic_partitions
    lines += [
        f"log.dirs={data}",
        f"metadata.log.dir={data}",
        "auto.create.topics.enable=true",
        "num.partitions=6",
        "default.replication.factor=1",
        "offsets.topic.replication.factor=1",
        f"offsets.topic.num.partitions={partitions}",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        f"transaction.state.log.num.partitions={partitions}",
        "min.insync.replicas=1",
        "group.initial.rebalance.delay.ms=0",
        f"num.network.threads={profile.network_threads}",
        f"num.io.threads={profile.io_threads}",
        "log.retention.hours=24",
        "log.segment.bytes=104857600",
        "delete.topic.enable=true",
    ]
    return lines


_LOADED = re.compile(r"\((\d+)/(\d+) completed in ")


def logs_loaded(log_text: str) -> str | None:
    """``N/M`` from the last log-loading line (LogManager's "(N/M completed in"), if any."""
    found = _LOADED.findall(log_text)
    return f"{found[-1][0]}/{found[-1][1]}" if found else None


class KafkaBroker(Service):
    """One broker: configuration, storage and logs in ``home``, jars in ``lib``."""

    name = "kafka"
    address_variable = "KAFKA_BOOTSTRAP_SERVERS"

    def __init__(
        self,
        *,
        ports: PortPlan,
        home: Path,
        lib: Path,
        profile: KafkaProfile = DEV_PROFILE,
        tls: DevTls | None = None,
    ) -> None:
        self.plan = ports
        self.home = home
        self.lib = lib
        self.profile = profile
        self.tls = tls
        self.needs = ("tls",) if profile.secured else ()
        self.data = home / "data"
        self.properties = home / "server.properties"
        self.wait_s = float(os.environ.get(WAIT_VARIABLE, "90"))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.plan.kafka}"

    def address(self) -> str:
        return self.bootstrap

    def proxy_route(self, n: int = 0) -> tuple[str, str]:
        """(where a fault proxy listens, the broker listener behind it)."""
        advertised, bound = self.plan.kafka_proxy(n)
        return f"127.0.0.1:{advertised}", f"127.0.0.1:{bound}"

    def ports(self) -> list[int]:
        return [bound for _, bound, _ in listeners(self.plan, self.profile)]

    def log_file(self) -> Path:
        return self.home / "logs" / "server.log"

    # -- declaration --------------------------------------------------------------------------
    def jvm(self) -> list[str]:
        return [
            f"-Xms{self.profile.heap_min}",
            f"-Xmx{self.profile.heap_max}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={self.home / 'logs'}",
            f"-Dlog4j2.configurationFile={LOG4J2}",
            "-cp",
            f"{self.lib}/*",
        ]

    def format_args(self) -> list[str]:
        """Storage-format inputs beyond the cluster id: the SCRAM users, which live in the
        cluster metadata; a change formats the (development) storage again."""
        if not self.profile.secured or self.tls is None:
            return []
        args = []
        for user in SCRAM_USERS:
            password = self.tls.password(f"kafka-scram-{user}")
            args += ["--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]"]
        return args

    def settings(self) -> list[str]:
        lines = [*server_properties(self.plan, self.data, self.profile, self.tls), *self.jvm()]
        lines.append(f"pom {hashlib.sha256(POM.read_bytes()).hexdigest()}")
        if self.tls and self.profile.secured:
            lines.append(f"certificates {self.tls.digest('kafka-server.pem', 'ca.pem')}")
        return lines

    def install(self) -> None:
        if shutil.which("java") is None:
            apt_install("openjdk-17-jre-headless")
        version = kafka_version()
        stamp = hashlib.sha256(POM.read_bytes()).hexdigest()
        jar = self.lib / f"kafka_2.13-{version}.jar"
        marker = self.lib / ".pom.sha256"
        if jar.exists() and marker.exists() and marker.read_text().strip() == stamp:
            return
        if shutil.which("mvn") is None:
            apt_install("maven")
        log.info("kafka: fetching Apache Kafka %s jars with Maven", version)
        shutil.rmtree(self.lib, ignore_errors=True)
        self.lib.parent.mkdir(parents=True, exist_ok=True)
        done = run(
            [
                "mvn",
                "-B",
                "-q",
                "-f",
                str(POM),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={self.lib}",
                "-DincludeScope=runtime",
            ],
            timeout=1800,
        )
        if done.returncode != 0 or not jar.exists():
            raise failure(
                "kafka", "mvn dependency:copy-dependencies failed", output=done.stdout + done.stderr
            )
        marker.write_text(stamp + "\n")

    # -- life ---------------------------------------------------------------------------------
    def pid(self) -> int | None:
        if self._process is not None and self._process.poll() is None:
            # Started by this process and not reaped, so its pid is not reused: ours, even
            # while its /proc cmdline still reads empty, as it can just after the launch.
            return self._process.pid
        command = ["kafka.Kafka", str(self.properties)]
        found = pid_from_file(self.home / "kafka.pid", command_has=command)
        if found is None:
            # A pid file that names no live broker (written over, or left by a start that
            # raced): the broker listening on this checkout's address, if its command line
            # is this checkout's, is still ours to stop.
            listening = pid_listening_on(self.bootstrap)
            if listening is not None and all(part in command_line(listening) for part in command):
                found = listening
        return found

    def running(self) -> bool:
        return self.pid() is not None

    def format(self) -> None:
        """Format the storage, unless it was formatted with the same inputs."""
        wanted = hashlib.sha256("\n".join(self.format_args()).encode()).hexdigest()
        meta = self.data / "meta.properties"
        stamp = self.data / ".format.sha256"
        if meta.exists() and (not stamp.exists() or stamp.read_text().strip() != wanted):
            log.info("kafka: the storage was formatted with other inputs; formatting it again")
            shutil.rmtree(self.data)
        if meta.exists():
            return
        self.data.mkdir(parents=True, exist_ok=True)
        drawn = cluster_id()
        log.info("kafka: formatting its storage (cluster id %s)", drawn)
        done = run(
            [
                "java",
                *self.jvm(),
                "kafka.tools.StorageTool",
                "format",
                "-t",
                drawn,
                "-c",
                str(self.properties),
                *self.format_args(),
            ],
            timeout=300,
            cwd=self.home,
        )
        if done.returncode != 0:
            raise failure("kafka", "storage format failed", output=done.stdout + done.stderr)
        stamp.write_text(wanted + "\n")

    def configure(self) -> None:
        """Write server.properties."""
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        self.properties.write_text(
            "# written by python -m scripts.services; a change restarts the broker\n"
            + "\n".join(server_properties(self.plan, self.data, self.profile, self.tls))
            + "\n"
        )
        self.properties.chmod(0o600)  # it holds the PLAIN user's password

    def start(self) -> None:
        self.configure()
        self.format()
        log.info("kafka: starting Apache Kafka %s (KRaft) on %s", kafka_version(), self.bootstrap)
        # server.log is appended to across starts: progress is read from where it ends now
        offset = self.log_file().stat().st_size if self.log_file().exists() else 0
        (self.home / "server.log.offset").write_text(f"{offset}\n")
        with (self.home / "stdout.log").open("wb") as out:
            # a session of its own: the broker outlives this process and a terminal's Ctrl-C
            self._process = subprocess.Popen(
                ["java", *self.jvm(), "kafka.Kafka", str(self.properties)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.home,
                start_new_session=True,
            )
        (self.home / "kafka.pid").write_text(f"{self._process.pid}\n")

    def progress(self) -> str | None:
        try:
            offset = int((self.home / "server.log.offset").read_text().strip() or 0)
        except (OSError, ValueError):
            offset = 0
        try:
            with self.log_file().open("rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return None
        loaded = logs_loaded(text)
        return f"loading its logs, {loaded} partitions" if loaded else None

    def ready(self) -> str | None:
        return kafka_answer(self.bootstrap)

    def probe(self, address: str) -> str | None:
        return kafka_answer(address)

    def stop(self) -> None:
        pid = self.pid()
        if pid is None:
            return
        log.info("kafka: stopping pid %d", pid)
        if self._process is not None and self._process.pid == pid:
            # our child: wait for it, so that it is reaped
            self._process.terminate()
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=30)
        else:
            terminate(pid, grace_s=60, service=self.name)
        if not alive(pid):
            (self.home / "kafka.pid").unlink(missing_ok=True)

    def env(self) -> dict[str, str]:
        values = {
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "KAFKA_PROXY_ROUTES": proxy_routes(self.plan, self.profile),
        }
        if self.profile.secured and self.tls is not None:
            tls = self.tls
            values |= {
                "KAFKA_SASL_SSL_BOOTSTRAP": f"127.0.0.1:{self.plan.kafka_sasl_ssl}",
                "KAFKA_SSL_BOOTSTRAP": f"127.0.0.1:{self.plan.kafka_ssl}",
                "KAFKA_TEST_CAFILE": str(tls.ca),
                "KAFKA_TEST_CLIENT_CERTFILE": str(tls.path("kafka-client.crt")),
                "KAFKA_TEST_CLIENT_KEYFILE": str(tls.path("kafka-client.key")),
                "KAFKA_TEST_SCRAM_RELAY_PASSWORD_FILE": str(tls.path("kafka-scram-relay.password")),
                "KAFKA_TEST_SCRAM_ADMIN_PASSWORD_FILE": str(tls.path("kafka-scram-admin.password")),
                "KAFKA_TEST_PLAIN_RELAY_PASSWORD_FILE": str(tls.path("kafka-plain-relay.password")),
            }
        return values

    def describe(self) -> str:
        return f"Apache Kafka {kafka_version()}, state {self.home}"
