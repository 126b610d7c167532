"""The rendered manifests as processes on this machine: each container turned into the
argv and environment the kubelet would give it (the image's entry point and env, then the
pod's), its ConfigMaps and Secrets resolved to the test's values, mounted ones written as
files at the paths the environment names."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from migrations.grants import SCORING_FUNCTIONS_OWNER
from tests.deploy.conftest import one
from tests.support.ports import free_port


def env_file(path: Path) -> dict[str, str]:
    """The pairs of an overlay's ``.env`` file."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


@dataclass(frozen=True)
class Pod:
    """One container as the kubelet would start it, turned into a process's argv and env."""

    name: str
    argv: list[str]
    env: dict[str, str]
    port: int | None


class Cluster:
    """What the manifests' references resolve to here: the overlay's ConfigMaps (settings
    in ``settings`` replaced: the services' addresses, this test's topics) and its database
    Secret (the overlay's roles and passwords, with ``suffix`` on the roles, at the test's
    server), other Secrets as ``secrets`` gives them (name → key → text), files the pods
    mount."""

    def __init__(
        self,
        rendered: list[dict[str, Any]],
        image: Mapping[str, Any],
        *,
        database_env: Path,
        server_url: str,
        settings: Mapping[str, str],
        suffix: str,
        workdir: Path,
        secrets: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.rendered = rendered
        self.image = image
        self.workdir = workdir
        self.suffix = suffix
        server = urlsplit(server_url)
        self.config_maps: dict[str, dict[str, str]] = {}
        for obj in rendered:
            if obj["kind"] == "ConfigMap":
                base = re.sub(r"-[a-z0-9]{10}$", "", obj["metadata"]["name"])
                self.config_maps[obj["metadata"]["name"]] = dict(obj["data"])
                self.config_maps[base] = dict(obj["data"])
        self.secrets = {name: dict(keys) for name, keys in (secrets or {}).items()}
        for data in self.config_maps.values():
            if "KAFKA_BOOTSTRAP_SERVERS" in data:
                data.update(settings)
            for key in ("WRITER_ROLE", "EVENT_WRITER_ROLE", "RELAY_ROLE", "SIDECAR_ROLE"):
                if key in data:
                    data[key] = data[key] + suffix
        # The Secret's URLs: the overlay's role and password, this server's address.
        self.secret: dict[str, str] = {}
        for key, url in env_file(database_env).items():
            parts = urlsplit(url)
            netloc = f"{parts.username}{suffix}:{parts.password}@{server.hostname}:{server.port}"
            self.secret[key] = urlunsplit(server._replace(netloc=netloc))
        self.roles = {key: urlsplit(url).username or "" for key, url in self.secret.items()}
        self.passwords = {key: urlsplit(url).password or "" for key, url in self.secret.items()}

    def pod(self, container: Mapping[str, Any], volumes: list[dict[str, Any]], name: str) -> Pod:
        """The process a container is: the image's entry point and env, then the pod's."""
        env = dict(self.image["env"])
        env.pop("PATH", None)
        for source in container.get("envFrom", []):
            env.update(self.config_maps[source["configMapRef"]["name"]])
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = item["value"]
                continue
            ref = item["valueFrom"]
            if "secretKeyRef" in ref:
                env[item["name"]] = self.secret[ref["secretKeyRef"]["key"]]
            elif ref.get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[item["name"]] = name
            else:
                raise AssertionError(f"an env source the test does not resolve: {ref}")
        # Mounted ConfigMaps and Secrets become files (a Secret's `items` pick and name its
        # keys); the env names them at the mount path.
        for mount in container.get("volumeMounts", []):
            (volume,) = [v for v in volumes if v["name"] == mount["name"]]
            if "configMap" in volume:
                files = self.config_maps[volume["configMap"]["name"]]
            elif "secret" in volume:
                keys = self.secrets[volume["secret"]["secretName"]]
                items = volume["secret"].get("items") or [{"key": k, "path": k} for k in keys]
                files = {item["path"]: keys[item["key"]] for item in items}
            else:
                continue
            directory = self.workdir / name / mount["name"]
            directory.mkdir(parents=True, exist_ok=True)
            for file, text in files.items():
                (directory / file).write_text(text)
            for key, value in env.items():
                if value.startswith(mount["mountPath"] + "/"):
                    env[key] = str(directory / value.removeprefix(mount["mountPath"] + "/"))
        args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]
        ports = [p["containerPort"] for p in container.get("ports", [])]
        port = None
        if ports:
            # The pod's own network: the declared port is the image's PORT, moved here to a
            # free one so four pods share this machine's loopback.
            assert ports == [int(env["PORT"])], (ports, env["PORT"])
            port = free_port()
            env["PORT"] = str(port)
        entrypoint = [str(Path(sys.executable).parent / self.image["entrypoint"][0])]
        return Pod(name, entrypoint + args, env, port)

    def pods(self, kind: str, name: str, replicas: int = 1) -> list[Pod]:
        """Every container of the workload, in the order the kubelet runs them."""
        spec = one(self.rendered, kind, name)["spec"]["template"]["spec"]
        volumes = spec.get("volumes", [])
        containers = spec.get("initContainers", []) + spec["containers"]
        return [
            self.pod(container, volumes, f"{name}-{index}")
            for index in range(replicas)
            for container in containers
        ]


async def make_roles(admin: asyncpg.Connection, cluster: Cluster, database: str) -> list[str]:
    """The roles a DBA makes before the Job runs: one login per part, the Job's owning the
    database."""
    made = []
    for key, role in cluster.roles.items():
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        password = cluster.passwords[key].replace("'", "''")
        await admin.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'")
        made.append(role)
    owner = cluster.roles["migrate-url"]
    await admin.execute(f'ALTER DATABASE "{database}" OWNER TO "{owner}"')
    for key in ("WRITER_ROLE", "EVENT_WRITER_ROLE"):  # the applications' own roles
        writer = cluster.config_maps["outbox-relay-roles"][key]
        await admin.execute(f'DROP ROLE IF EXISTS "{writer}"')
        await admin.execute(f'CREATE ROLE "{writer}"')
        made.append(writer)
    # The one grant the Job prints for a superuser (docs/security.md): the sidecar sees
    # other roles' open transactions.
    await admin.execute(f'GRANT pg_read_all_stats TO "{cluster.roles["sidecar-url"]}"')
    # The one-time step a superuser takes before migration 0012 (docs/operations.md): the
    # Job's role may hand the scoring functions to their NOLOGIN owner.
    await admin.execute(
        f"DO $$ BEGIN CREATE ROLE {SCORING_FUNCTIONS_OWNER} NOLOGIN; "
        "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
    )
    await admin.execute(f'GRANT {SCORING_FUNCTIONS_OWNER} TO "{owner}"')
    return made


async def run_once(pod: Pod) -> tuple[int, str]:
    """Run a pod's process to its end: its exit code and output."""
    # The image's PATH puts its venv first: here, this one.
    argv = [str(Path(sys.executable)) if pod.argv[0] == "python" else pod.argv[0], *pod.argv[1:]]
    process = await asyncio.create_subprocess_exec(
        *argv,
        env={"PATH": os.environ["PATH"], **pod.env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, out.decode(errors="replace")


@asynccontextmanager
async def running(pod: Pod, logs: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A pod's process, its output in ``logs/<pod>.log``, stopped (SIGTERM) at the end."""
    with (logs / f"{pod.name}.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *pod.argv, env={"PATH": os.environ["PATH"], **pod.env}, stdout=log, stderr=log
        )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()
