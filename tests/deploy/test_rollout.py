"""In deploy/'s shape an upgrade's rollout waits for its migration Job: the rendered
manifests' commands run as processes (tests/deploy/test_contract.py's Cluster), the previous
release's pods (release/previous.toml, run from a ``git worktree``) under their own roles,
then the next release's pods started as the Deployment controller starts them under the
rendered strategy (relays: ``maxSurge: 0``, ``maxUnavailable: 1``; the sidecar: ``maxSurge:
1``, ``maxUnavailable: 0``), before its Job ran.

The new relay pod stays unready and claims no lane, so the controller replaces no second
relay, and the new sidecar (whose role may not even read the migration level before this
release's grant) stays unready, so the old one keeps serving; the two old relays publish
meanwhile. Once the Job has migrated and granted, the new pods become ready by themselves
and the rollout completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from tests.deploy.conftest import EXAMPLE, REPO, one, render
from tests.deploy.pods import Cluster, Pod, make_roles
from tests.support.http import get
from tests.support.release import (
    code_at,
    migrations_of,
    next_release,
    previous_release,
    worktree,
)
from tests.support.running import Code
from tests.support.waiting import wait_until

TICK_S = 0.5
HOLD_S = 6.0  # how long the rollout is watched holding before the Job runs

_EVENTS = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT 'order', 'order-' || $2::int || '-' || n, 'test.rollout', jsonb_build_object('n', n)
FROM generate_series(1, $1) AS n
"""


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with worktree(previous_release().commit, tmp_path_factory.mktemp("previous") / "tree") as tree:
        yield tree


@pytest.fixture(scope="module")
def previous_rendered(kustomize: str, previous_tree: Path) -> list[dict[str, Any]]:
    """The previous release's own manifests: its pods and its Job were applied from them."""
    return render(kustomize, previous_tree / EXAMPLE.relative_to(REPO))


@dataclass
class PodProcess:
    """A pod's container of one release, running."""

    pod: Pod
    release: str
    process: asyncio.subprocess.Process

    async def ready(self) -> bool:
        assert self.pod.port is not None
        try:
            return (await get(("127.0.0.1", self.pod.port), "/readyz")).status == 200
        except OSError:
            return False

    async def stop(self) -> int:
        if self.process.returncode is None:
            self.process.terminate()
            await asyncio.wait_for(self.process.wait(), 30)
        return self.process.returncode or 0


def _argv(pod: Pod, code: Code) -> list[str]:
    """The container's command with ``code`` as the image: its entry point, then the args."""
    return [*code.command, *pod.argv[1:]]


async def _start(pod: Pod, code: Code, release: str, logs: Path) -> PodProcess:
    with (logs / f"{release}-{pod.name}.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *_argv(pod, code),
            cwd=code.cwd,
            env={"PATH": os.environ["PATH"], **code.env, **pod.env},
            stdout=log,
            stderr=log,
        )
    return PodProcess(pod, release, process)


def _job_name(rendered: list[dict[str, Any]]) -> str:
    (name,) = (o["metadata"]["name"] for o in rendered if o["kind"] == "Job")
    return str(name)


async def _job(cluster: Cluster, code: Code) -> None:
    """The rendered Job's steps, in order, each to success."""
    for step in cluster.pods("Job", _job_name(cluster.rendered)):
        process = await asyncio.create_subprocess_exec(
            *_argv(step, code),
            cwd=code.cwd,
            env={"PATH": os.environ["PATH"], **code.env, **step.env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode == 0, (step.argv[1:], out.decode(errors="replace"))


@dataclass
class Rollout:
    """The Deployment controller's rule for one Deployment: take an old pod down only while
    enough stay available, start a new one only while the surge allows; available means
    ready (the readiness probe is /readyz)."""

    replicas: int
    max_surge: int
    max_unavailable: int
    old: list[PodProcess]
    new_pods: list[Pod]
    start: Any
    new: list[PodProcess] = field(default_factory=list)
    taken_down: int = 0

    async def step(self) -> None:
        ready = [p for p in [*self.old, *self.new] if await p.ready()]
        total = len(self.old) + len(self.new)
        if self.new_pods and total < self.replicas + self.max_surge:
            self.new.append(await self.start(self.new_pods.pop(0)))
            return
        if self.old and len(ready) - (self.old[0] in ready) >= self.replicas - self.max_unavailable:
            assert await self.old.pop(0).stop() == 0
            self.taken_down += 1

    def done(self) -> bool:
        return not self.old and not self.new_pods


def _renamed(pod: Pod) -> Pod:
    """A pod of the new ReplicaSet: another name, so another instance id (its pod name)."""
    name = f"{pod.name}-next"
    return dataclasses.replace(pod, name=name, env={**pod.env, "OUTBOX_RELAY_INSTANCE_ID": name})


def _strategy(rendered: list[dict[str, Any]], name: str) -> tuple[int, int, int]:
    spec = one(rendered, "Deployment", name)["spec"]
    rolling = spec["strategy"]["rollingUpdate"]
    return spec["replicas"], rolling["maxSurge"], rolling["maxUnavailable"]


@contextlib.asynccontextmanager
async def _stopped_at_end(pods: list[PodProcess]) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for pod in pods:
            if pod.process.returncode is None:
                pod.process.kill()
                await pod.process.wait()


@pytest.mark.timeout(300)
async def test_a_rollout_waits_for_its_migration_job(
    rendered: list[dict[str, Any]],
    previous_rendered: list[dict[str, Any]],
    image: dict[str, Any],
    previous_tree: Path,
    empty_database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
) -> None:
    database = urlsplit(empty_database_url).path.lstrip("/")
    settings = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_RELAY_TOPIC_TEMPLATE": f"{topic_namespace}.{{aggregatetype}}",
        "OUTBOX_RELAY_ALLOWED_TOPICS": rf"{re.escape(topic_namespace)}\..*",
    }
    suffix = f"_{uuid.uuid4().hex[:8]}"
    cluster = Cluster(
        rendered,
        image,
        database_env=EXAMPLE / "database.env",
        server_url=empty_database_url,
        settings=settings,
        suffix=suffix,
        workdir=tmp_path,
    )
    # The same roles and database, as the previous release's manifests name them.
    (tmp_path / "previous").mkdir()
    old_cluster = Cluster(
        previous_rendered,
        image,
        database_env=previous_tree / EXAMPLE.relative_to(REPO) / "database.env",
        server_url=empty_database_url,
        settings=settings,
        suffix=suffix,
        workdir=tmp_path / "previous",
    )
    assert old_cluster.roles == cluster.roles
    previous = code_at(previous_tree, "previous release")
    new = next_release(migrations_of(previous_tree), tmp_path)
    relay_strategy = _strategy(rendered, "outbox-relay")
    sidecar_strategy = _strategy(rendered, "outbox-relay-sidecar")
    assert relay_strategy == (3, 0, 1)
    assert sidecar_strategy == (1, 1, 0)
    admin = await asyncpg.connect(empty_database_url)
    roles = await make_roles(admin, cluster, database)
    everything: list[PodProcess] = []
    try:
        async with _stopped_at_end(everything):
            # The previous release, deployed: its Job, then its pods.
            await _job(old_cluster, previous)
            (sidecar_pod,) = old_cluster.pods("Deployment", "outbox-relay-sidecar")
            relay_pods = old_cluster.pods("Deployment", "outbox-relay", replicas=3)
            old = [await _start(p, previous, "old", tmp_path) for p in [sidecar_pod, *relay_pods]]
            everything += old
            await wait_until(lambda: _all_ready(old), what="the previous release ready", timeout=60)

            async def start_new(pod: Pod) -> PodProcess:
                started = await _start(pod, new.code, "new", tmp_path)
                everything.append(started)
                return started

            # The next release, applied: the controller rolls both Deployments.
            fresh = [_renamed(p) for p in cluster.pods("Deployment", "outbox-relay", replicas=3)]
            (fresh_sidecar,) = cluster.pods("Deployment", "outbox-relay-sidecar")
            relays = Rollout(*relay_strategy, old=old[1:], new_pods=fresh, start=start_new)
            sidecars = Rollout(
                *sidecar_strategy, old=old[:1], new_pods=[fresh_sidecar], start=start_new
            )
            batch = 0
            deadline = time.monotonic() + HOLD_S
            while time.monotonic() < deadline:
                await relays.step()
                await sidecars.step()
                batch += 1
                await admin.execute(_EVENTS, 10, batch)
                await asyncio.sleep(TICK_S)
            # Held: one relay replaced by an unready pod that claimed nothing, the old
            # sidecar still serving beside an unready new one.
            assert (relays.taken_down, len(relays.new), len(relays.old)) == (1, 1, 2)
            assert (sidecars.taken_down, len(sidecars.new)) == (0, 1)
            assert not await relays.new[0].ready()
            assert not await sidecars.new[0].ready()
            assert await sidecars.old[0].ready()
            waiting = relays.new[0].pod.env["OUTBOX_RELAY_INSTANCE_ID"]
            assert (
                await admin.fetchval("SELECT count(*) FROM relay_lane WHERE owner_id = $1", waiting)
                == 0
            )
            # The two old relays publish all the while.
            await wait_until(
                lambda: _count_is(admin, "SELECT count(*) FROM outbox", 0),
                what="the events of the hold published by the old relays",
                timeout=30,
            )

            # The Job runs: the new pods become ready by themselves, the rollout completes.
            await _job(cluster, new.code)
            while not (relays.done() and sidecars.done()):
                await relays.step()
                await sidecars.step()
                batch += 1
                await admin.execute(_EVENTS, 10, batch)
                await asyncio.sleep(TICK_S)
            await wait_until(
                lambda: _all_ready([*relays.new, *sidecars.new]),
                what="the new release ready",
                timeout=60,
            )
            await wait_until(
                lambda: _count_is(admin, "SELECT count(*) FROM outbox", 0),
                what="every event published",
                timeout=60,
            )
            published = await admin.fetchval("SELECT count(*) FROM outbox_receipt")
            assert published == 10 * batch
    finally:
        for role in roles:
            await admin.execute(f'DROP OWNED BY "{role}" CASCADE')
        await admin.execute(f'ALTER DATABASE "{database}" OWNER TO CURRENT_USER')
        for role in roles:
            await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()


async def _all_ready(pods: list[PodProcess]) -> bool:
    return all([await pod.ready() for pod in pods])


async def _count_is(conn: asyncpg.Connection, query: str, expected: int) -> bool:
    return bool(await conn.fetchval(query) == expected)
