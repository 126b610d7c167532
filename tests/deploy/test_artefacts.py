"""deploy/ renders with kustomize into objects the Kubernetes schemas of a current release
accept (kubernetes-validate, offline), the Prometheus-operator objects carry what that
operator requires, a planted error is refused, and the Dockerfile and compose.yaml say what
a platform needs: the CLI as the entry point, a numeric user, a listen address PORT moves,
the lock installed, labels, a stop grace longer than the drain."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from contracts import __version__
from relay.config import RelayConfig
from tests.deploy.conftest import (
    DEPLOY,
    EXAMPLE,
    MIGRATE_JOB,
    REPO,
    Instruction,
    compose_services,
    dockerfile_stages,
    one,
    render,
)

KUBERNETES = "1.37.0"  # the newest schemas kubernetes-validate ships
OPERATOR_GROUP = "monitoring.coreos.com/v1"
ALERTS = REPO / "docs" / "monitoring" / "alerts.yaml"


def validate(objects: list[dict[str, Any]]) -> list[str]:
    """Every schema error of the core objects (unknown fields refused); the operator's
    objects are checked by :func:`operator_errors`."""
    errors = []
    for obj in objects:
        if obj["apiVersion"] == OPERATOR_GROUP:
            errors.extend(operator_errors(obj))
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    return errors


def operator_errors(obj: dict[str, Any]) -> list[str]:
    """The fields the Prometheus operator requires of a PodMonitor and a PrometheusRule."""
    name = f"{obj['kind']}/{obj.get('metadata', {}).get('name')}"
    spec = obj.get("spec") or {}
    errors = []
    if obj["kind"] == "PodMonitor":
        if not isinstance(spec.get("selector"), dict):
            errors.append(f"{name}: spec.selector is required")
        endpoints = spec.get("podMetricsEndpoints")
        if not endpoints:
            errors.append(f"{name}: spec.podMetricsEndpoints is required")
        for endpoint in endpoints or []:
            if not (endpoint.get("port") or endpoint.get("portNumber")):
                errors.append(f"{name}: every endpoint names its port")
    elif obj["kind"] == "PrometheusRule":
        groups = spec.get("groups")
        if not groups:
            errors.append(f"{name}: spec.groups is required")
        for group in groups or []:
            if not group.get("name"):
                errors.append(f"{name}: every group has a name")
            for rule in group.get("rules") or []:
                if not rule.get("expr") or not (rule.get("alert") or rule.get("record")):
                    errors.append(f"{name}: every rule has expr and alert or record")
    else:
        errors.append(f"{name}: not an object of this kit")
    return errors


def test_the_example_overlay_renders_to_valid_objects(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in rendered)
    assert kinds == sorted(
        [
            *("ServiceAccount", "ConfigMap", "ConfigMap", "ConfigMap", "Secret"),
            *("Deployment", "Deployment", "Job", "PodDisruptionBudget"),
            *("PodMonitor", "PrometheusRule"),
        ]
    )
    assert validate(rendered) == []
    assert {o["metadata"].get("namespace") for o in rendered} == {"scoring"}


@pytest.mark.parametrize(
    ("where", "plant"),
    [
        ("Deployment", lambda o: o["spec"]["template"]["spec"]["containers"][0].update(portz=1)),
        ("PodDisruptionBudget", lambda o: o["spec"].update(maxUnavailable=[1])),
        ("Job", lambda o: o["spec"]["template"]["spec"].update(restartPolicy=7)),
        ("PodMonitor", lambda o: o["spec"].pop("podMetricsEndpoints")),
        ("PrometheusRule", lambda o: o["spec"]["groups"][0]["rules"][0].pop("expr")),
    ],
)
def test_a_planted_error_is_refused(rendered: list[dict[str, Any]], where: str, plant: Any) -> None:
    broken = copy.deepcopy(rendered)
    plant(next(o for o in broken if o["kind"] == where))
    assert len(validate(broken)) == 1


def test_a_broken_base_does_not_render(kustomize: str, tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        f"resources:\n  - {DEPLOY / 'base'}\npatches:\n  - target: {{kind: Deployment}}\n"
        "    patch: '[{op: replace, path: /spec/nothing/here, value: 1}]'\n"
    )
    with pytest.raises(AssertionError):
        render(kustomize, overlay)


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = obj["spec"]["template"]["spec"]
    return pod


def test_every_pod_is_hardened_and_under_its_own_role(
    rendered: list[dict[str, Any]], image: dict[str, Any]
) -> None:
    user, group = (int(n) for n in image["user"].split(":"))
    secret_keys = {
        "outbox-relay": "relay-url",
        "outbox-relay-sidecar": "sidecar-url",
        MIGRATE_JOB: "migrate-url",
    }
    for kind, name in (
        ("Deployment", "outbox-relay"),
        ("Deployment", "outbox-relay-sidecar"),
        ("Job", MIGRATE_JOB),
    ):
        pod = _pod(one(rendered, kind, name))
        assert pod["automountServiceAccountToken"] is False
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True
        assert (security["runAsUser"], security["runAsGroup"]) == (user, group)  # the image's
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod.get("initContainers", []) + pod["containers"]:
            hardened = container["securityContext"]
            assert hardened["allowPrivilegeEscalation"] is False
            assert hardened["readOnlyRootFilesystem"] is True
            assert hardened["capabilities"] == {"drop": ["ALL"]}
            assert container["resources"]["requests"]["cpu"]
            assert container["resources"]["limits"]["memory"]
            assert "cpu" not in container["resources"]["limits"]  # throttling is latency
            (url,) = [e for e in container["env"] if e["name"] == "DATABASE_URL"]
            assert url["valueFrom"]["secretKeyRef"]["key"] == secret_keys[name]


def test_relays_spread_drain_one_at_a_time_and_outlast_the_drain(
    rendered: list[dict[str, Any]],
) -> None:
    relay = one(rendered, "Deployment", "outbox-relay")
    assert relay["spec"]["replicas"] == 3
    assert relay["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 1
    pod = _pod(relay)
    keys = {c["topologyKey"] for c in pod["topologySpreadConstraints"]}
    assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    drain_s = RelayConfig.__dataclass_fields__["drain_timeout_ms"].default / 1000
    assert pod["terminationGracePeriodSeconds"] > drain_s
    budget = one(rendered, "PodDisruptionBudget", "outbox-relay")["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert budget["selector"] == relay["spec"]["selector"]
    (container,) = pod["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_the_podmonitor_scrapes_every_pod_as_the_rules_job(rendered: list[dict[str, Any]]) -> None:
    monitor = one(rendered, "PodMonitor", "outbox-relay")["spec"]
    label = monitor["jobLabel"]
    for kind, name in (("Deployment", "outbox-relay"), ("Deployment", "outbox-relay-sidecar")):
        labels = one(rendered, kind, name)["spec"]["template"]["metadata"]["labels"]
        assert monitor["selector"]["matchLabels"].items() <= labels.items()
        assert labels[label] == "outbox-relay"  # the job every rule selects
        ports = {
            p["name"] for c in _pod(one(rendered, kind, name))["containers"] for p in c["ports"]
        }
        assert {e["port"] for e in monitor["podMetricsEndpoints"]} <= ports


def test_the_prometheusrule_is_the_kit_with_the_overlays_runbook(
    rendered: list[dict[str, Any]],
) -> None:
    kit = yaml.safe_load(ALERTS.read_text())["groups"]
    base = yaml.safe_load((DEPLOY / "base" / "prometheusrule.yaml").read_text())["spec"]["groups"]
    assert base == kit
    config = one(rendered, "ConfigMap", "outbox-relay-config")["data"]
    runbook = config["OUTBOX_RELAY_RUNBOOK_URL"]
    groups = one(rendered, "PrometheusRule", "outbox-relay")["spec"]["groups"]
    for group, kit_group in zip(groups, kit, strict=True):
        for rule, kit_rule in zip(group["rules"], kit_group["rules"], strict=True):
            anchor = kit_rule["annotations"]["runbook_url"].partition("#")[2]
            assert rule["annotations"]["runbook_url"] == f"{runbook}#{anchor}"


# -- the image ---------------------------------------------------------------------------------
def test_the_image_runs_the_cli_as_a_numeric_user_listening_where_port_says(
    image: dict[str, Any],
) -> None:
    assert image["entrypoint"] == ["outbox-relay"]
    assert image["cmd"] == ["run"]
    user, _, group = image["user"].partition(":")
    assert user.isdigit() and int(user) != 0 and group.isdigit()
    env = image["env"]
    # PORT (all interfaces) and not HEALTH_LISTEN_ADDR, which would win over a platform's PORT.
    assert "HEALTH_LISTEN_ADDR" not in env
    assert image["expose"] == [env["PORT"]]
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"  # a read-only root filesystem stays clean
    assert image["healthcheck"] == ["python", "-m", "outbox_relay.healthcheck"]


def test_the_base_and_the_example_overlay_deploy_this_release() -> None:
    base = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    assert base["images"] == [{"name": "outbox-relay", "newTag": __version__}]
    overlay = yaml.safe_load((EXAMPLE / "kustomization.yaml").read_text())
    assert [image["newTag"] for image in overlay["images"]] == [__version__]


def test_the_migration_job_is_this_releases_and_is_kept(rendered: list[dict[str, Any]]) -> None:
    (job,) = [o for o in rendered if o["kind"] == "Job"]
    # Named for the release, so a re-apply finds it done and the next release runs its own;
    # kept, so a GitOps tool never runs it again after a TTL removed it.
    assert job["metadata"]["name"] == f"outbox-relay-migrate-{__version__.replace('.', '-')}"
    assert "ttlSecondsAfterFinished" not in job["spec"]


def test_the_image_carries_oci_labels_and_installs_the_runtime_lock(image: dict[str, Any]) -> None:
    labels = image["labels"]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert labels["org.opencontainers.image.licenses"] == project["license"]
    assert labels["org.opencontainers.image.title"] == project["name"]
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert image["args"]["VERSION"] == __version__
    for key in ("source", "revision", "description"):
        assert f"org.opencontainers.image.{key}" in labels
    runs = [i.text for stage in dockerfile_stages() for i in stage if i.keyword == "RUN"]
    installs = [part for run in runs for part in run.split("&&") if "pip install" in part]
    assert installs
    for install in installs:
        # Dependencies come from the lock only (hashes checked); the package adds none.
        assert "--no-deps" in install, install
        assert ("--require-hashes" in install and "requirements-runtime.lock" in install) or (
            install.rstrip().endswith(" .")
        ), install


def test_the_instruction_reader_joins_continuations(tmp_path: Path) -> None:
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text('FROM a\n# note\nENV A=1 \\\n    B="two words"\nCMD ["x", "y"]\n')
    ((_, env, cmd),) = dockerfile_stages(dockerfile)
    assert env == Instruction("ENV", 'A=1 B="two words"')
    assert env.pairs() == {"A": "1", "B": "two words"}
    assert cmd.exec_form() == ["x", "y"]


# -- compose -------------------------------------------------------------------------------------
def test_compose_runs_what_the_manifests_run_and_outlasts_the_drain(
    rendered: list[dict[str, Any]],
) -> None:
    services = compose_services()
    args = {
        name: _pod(one(rendered, "Deployment", name))["containers"][0]["args"]
        for name in ("outbox-relay", "outbox-relay-sidecar")
    }
    job = _pod(one(rendered, "Job", MIGRATE_JOB))
    assert services["migrate"]["command"] == job["initContainers"][0]["args"]
    relays = [s for s in services.values() if s.get("command") == args["outbox-relay"]]
    assert len(relays) >= 2
    assert services["sidecar"]["command"] == args["outbox-relay-sidecar"]
    drain_s = RelayConfig.__dataclass_fields__["drain_timeout_ms"].default / 1000
    for relay in relays:
        grace = re.fullmatch(r"(\d+)s", relay["stop_grace_period"])
        assert grace and int(grace.group(1)) > drain_s
        assert "OUTBOX_RELAY_POLICY" not in relay["environment"]


def test_every_file_the_overlay_reads_is_in_it() -> None:
    kustomization = yaml.safe_load((EXAMPLE / "kustomization.yaml").read_text())
    for generator in kustomization["configMapGenerator"] + kustomization["secretGenerator"]:
        for name in generator.get("envs", []) + generator.get("files", []):
            assert (EXAMPLE / name).is_file(), name
