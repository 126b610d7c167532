"""deploy/ renders with kustomize into objects the Kubernetes schemas of a current release
accept (kubernetes-validate, offline) and the operators' objects their CRD schemas accept
(Strimzi's and the Prometheus operator's, scripts/node), a planted error is refused; a
default kube-prometheus-stack selects the monitoring objects, two installs in a namespace
select only their own pods, and the Strimzi overlay holds the ACLs docs/security.md lists
and mounts what its settings name. The Dockerfile and compose.yaml say what a platform
needs: the CLI as the entry point, a numeric user, a listen address PORT moves, the lock
installed, labels, a stop grace longer than the drain."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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
    STRIMZI,
    Instruction,
    compose_services,
    dockerfile_stages,
    one,
    render,
)
from tests.support.http import PROMPT_S
from tests.support.node import crd_errors

KUBERNETES = "1.37.0"  # the newest schemas kubernetes-validate ships
CUSTOM_GROUPS = ("monitoring.coreos.com", "kafka.strimzi.io")
ALERTS = REPO / "docs" / "monitoring" / "alerts.yaml"
DASHBOARD = REPO / "docs" / "monitoring" / "dashboard.json"
SECURITY = REPO / "docs" / "security.md"
# kube-prometheus-stack's defaults (chart 88.5.3, values.yaml and
# templates/prometheus/prometheus.yaml): its Prometheus selects PodMonitors and
# PrometheusRules labelled `release: <the Helm release>` (podMonitorSelectorNilUsesHelmValues,
# ruleSelectorNilUsesHelmValues), its Grafana sidecar loads ConfigMaps labelled
# grafana_dashboard: "1" in every namespace. The overlays use the usual release name.
STACK_RELEASE = "kube-prometheus-stack"
OVERLAYS = (EXAMPLE, STRIMZI)
STACK_SELECTS = {
    "PodMonitor": {"release": STACK_RELEASE},
    "PrometheusRule": {"release": STACK_RELEASE},
    "ConfigMap": {"grafana_dashboard": "1"},
}


def validate(objects: list[dict[str, Any]]) -> list[str]:
    """Every schema error: core objects against Kubernetes' (unknown fields refused), custom
    resources against their operators' CRD schemas."""
    errors = []
    custom = [o for o in objects if o["apiVersion"].split("/")[0] in CUSTOM_GROUPS]
    for obj in objects:
        if obj in custom:
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    return errors + crd_errors(custom)


def test_the_example_overlay_renders_to_valid_objects(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in rendered)
    assert kinds == sorted(
        [
            *("ServiceAccount", "ConfigMap", "ConfigMap", "ConfigMap", "ConfigMap", "Secret"),
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
        ("PodMonitor", lambda o: o["spec"].update(jobLabel=["app.kubernetes.io/name"])),
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


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_probes_wait_as_long_as_the_server_is_tested_to_answer(
    rendered: list[dict[str, Any]],
) -> None:
    for name in ("outbox-relay", "outbox-relay-sidecar"):
        (container,) = _pod(one(rendered, "Deployment", name))["containers"]
        for probe in ("livenessProbe", "readinessProbe"):
            assert container[probe]["timeoutSeconds"] == PROMPT_S, (name, probe)


@pytest.mark.parametrize("which", ["rendered", "rendered_strimzi"])
def test_every_object_says_its_release_and_install(which: str, request: Any) -> None:
    objects: list[dict[str, Any]] = request.getfixturevalue(which)
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/version"] == __version__, obj["metadata"]["name"]
        assert labels["app.kubernetes.io/instance"] == "outbox-relay", obj["metadata"]["name"]
        assert labels["app.kubernetes.io/part-of"] == "outbox-relay"
        if obj["kind"] in ("Deployment", "Job"):
            template = obj["spec"]["template"]["metadata"]["labels"]
            assert template["app.kubernetes.io/version"] == __version__
            for container in _pod(obj).get("initContainers", []) + _pod(obj)["containers"]:
                assert container["image"].endswith(f":{__version__}"), container["image"]


@pytest.mark.parametrize("which", ["rendered", "rendered_strimzi"])
def test_a_default_kube_prometheus_stack_loads_the_monitoring(which: str, request: Any) -> None:
    objects: list[dict[str, Any]] = request.getfixturevalue(which)
    selected = {
        o["kind"]
        for o in objects
        if o["kind"] in STACK_SELECTS
        and _matches(STACK_SELECTS[o["kind"]], o["metadata"].get("labels", {}))
    }
    assert selected == set(STACK_SELECTS)
    # What Grafana's sidecar loads is the dashboard; what Prometheus loads, the rules.
    (dashboard,) = [o for o in objects if "grafana_dashboard" in o["metadata"].get("labels", {})]
    (text,) = dashboard["data"].values()
    assert json.loads(text) == json.loads(DASHBOARD.read_text())
    rule = one(objects, "PrometheusRule", "outbox-relay")
    assert len(rule["spec"]["groups"]) == len(yaml.safe_load(ALERTS.read_text())["groups"])


def test_the_base_alone_is_not_selected_by_the_stack(kustomize: str) -> None:
    # The selector label is the overlay's to set (the name of your Helm release).
    base = render(kustomize, DEPLOY / "base")
    for obj in base:
        if obj["kind"] in ("PodMonitor", "PrometheusRule"):
            assert "release" not in obj["metadata"]["labels"]


def _pods(objects: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [
        o["spec"]["template"]["metadata"]["labels"]
        for o in objects
        if o["kind"] in ("Deployment", "Job")
    ]


def _selectors(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, str]]]:
    """Every label selector of a set of objects that picks pods."""
    found = []
    for o in objects:
        name = f"{o['kind']}/{o['metadata']['name']}"
        spec = o.get("spec", {})
        if o["kind"] in ("Deployment", "PodDisruptionBudget", "PodMonitor"):
            found.append((name, spec["selector"]["matchLabels"]))
        if o["kind"] == "NetworkPolicy":
            found.append((name, spec["podSelector"]["matchLabels"]))
        if o["kind"] == "Deployment":
            for constraint in spec["template"]["spec"].get("topologySpreadConstraints", []):
                found.append((name, constraint["labelSelector"]["matchLabels"]))
    return found


def _with_network_policy(source: Path, destination: Path, **changes: Any) -> Path:
    """A copy of an overlay in ``destination`` that adds the NetworkPolicy component (in the
    same kustomization as the install's labels, so its pod selector gets the install)."""
    shutil.copytree(source, destination)
    kustomization = yaml.safe_load((source / "kustomization.yaml").read_text())
    kustomization["resources"] = [
        os.path.relpath((source / r).resolve(), destination) for r in kustomization["resources"]
    ]
    policy = os.path.relpath(DEPLOY / "components" / "network-policy", destination)
    kustomization["components"] = [policy]
    kustomization.update(changes)
    (destination / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return destination


def test_two_installs_in_one_namespace_select_only_their_own_pods(
    kustomize: str, tmp_path: Path
) -> None:
    first = render(kustomize, _with_network_policy(EXAMPLE, tmp_path / "outbox-relay"))
    # A second install beside it: the example copied, with its own name and prefix.
    example_labels = yaml.safe_load((EXAMPLE / "kustomization.yaml").read_text())["labels"]
    labels = copy.deepcopy(example_labels)
    labels[0]["pairs"]["app.kubernetes.io/instance"] = "billing"
    second = render(
        kustomize,
        _with_network_policy(EXAMPLE, tmp_path / "billing", namePrefix="billing-", labels=labels),
    )
    assert validate(second) == []
    names = {(o["kind"], o["metadata"]["name"]) for o in first}
    assert names.isdisjoint((o["kind"], o["metadata"]["name"]) for o in second)
    for mine, theirs in ((first, second), (second, first)):
        selectors = _selectors(mine)
        assert {name.partition("/")[0] for name, _ in selectors} == {
            "Deployment",
            "PodDisruptionBudget",
            "PodMonitor",
            "NetworkPolicy",
        }
        for name, selector in selectors:
            assert any(_matches(selector, pod) for pod in _pods(mine)), name
            assert not any(_matches(selector, pod) for pod in _pods(theirs)), name


def test_the_network_policy_admits_the_scrape_and_the_services_ports(
    kustomize: str, tmp_path: Path
) -> None:
    objects = render(kustomize, _with_network_policy(EXAMPLE, tmp_path / "example"))
    assert validate(objects) == []
    policy = one(objects, "NetworkPolicy", "outbox-relay")["spec"]
    selected = [p for p in _pods(objects) if _matches(policy["podSelector"]["matchLabels"], p)]
    assert len(selected) == 3  # the relays, the sidecar and the Job
    (scrape,) = policy["ingress"]
    monitor = one(objects, "PodMonitor", "outbox-relay")["spec"]
    assert {p["port"] for p in scrape["ports"]} == {
        e["port"] for e in monitor["podMetricsEndpoints"]
    }
    allowed = {(p["port"], p["protocol"]) for rule in policy["egress"] for p in rule["ports"]}
    assert {(53, "UDP"), (53, "TCP")} <= allowed
    for directory in OVERLAYS:
        config = _env_file(directory / "config.env")
        for address in config["KAFKA_BOOTSTRAP_SERVERS"].split(","):
            assert (int(address.rpartition(":")[2]), "TCP") in allowed, address
        for url in _env_file(directory / "database.env").values():
            assert (urlsplit(url).port or 5432, "TCP") in allowed, url


def _env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


# -- Strimzi -----------------------------------------------------------------------------------
def test_the_strimzi_overlay_renders_to_objects_its_crds_accept(
    rendered_strimzi: list[dict[str, Any]],
) -> None:
    kinds = sorted(o["kind"] for o in rendered_strimzi)
    assert kinds == sorted(
        [
            *("ServiceAccount", "ConfigMap", "ConfigMap", "ConfigMap", "ConfigMap", "Secret"),
            *("Deployment", "Deployment", "Job", "PodDisruptionBudget", "NetworkPolicy"),
            *("PodMonitor", "PrometheusRule", "KafkaUser", "KafkaTopic"),
        ]
    )
    assert validate(rendered_strimzi) == []
    kustomization = yaml.safe_load((STRIMZI / "kustomization.yaml").read_text())
    assert kustomization["components"] == ["../../components/network-policy"]


@pytest.mark.parametrize(
    ("kind", "plant"),
    [
        # Strimzi calls a prefixed pattern `prefix`, not Kafka's `prefixed`.
        (
            "KafkaUser",
            lambda s: s["authorization"]["acls"][0]["resource"].update(patternType="prefixed"),
        ),
        ("KafkaUser", lambda s: s["authorization"]["acls"][0]["operations"].append("Produce")),
        ("KafkaUser", lambda s: s["authentication"].update(type="scram-sha-256")),
        ("KafkaTopic", lambda s: s.update(partitions="six")),
    ],
)
def test_a_planted_strimzi_error_is_refused(
    rendered_strimzi: list[dict[str, Any]], kind: str, plant: Any
) -> None:
    broken = copy.deepcopy(rendered_strimzi)
    plant(next(o for o in broken if o["kind"] == kind)["spec"])
    (error,) = validate(broken)
    assert error.startswith(f"{kind}/")


def _documented_acls() -> tuple[str, str, set[str]]:
    """The topic prefix, its pattern type and the operations of docs/security.md's
    `kafka-acls.sh` line: what the relay's principal needs."""
    (command,) = re.findall(r"^kafka-acls\.sh .*?(?<!\\)$", SECURITY.read_text(), re.M | re.S)
    words = shlex.split(command.replace("\\\n", " "))
    operations = {words[i + 1] for i, word in enumerate(words) if word == "--operation"}
    topic = words[words.index("--topic") + 1]
    pattern = words[words.index("--resource-pattern-type") + 1]
    return topic, pattern, operations


def test_the_kafka_user_holds_exactly_the_acls_security_md_lists(
    rendered_strimzi: list[dict[str, Any]],
) -> None:
    topic, pattern, operations = _documented_acls()
    assert operations == {"Write", "Describe", "DescribeConfigs"}
    user = one(rendered_strimzi, "KafkaUser", "outbox-relay")["spec"]
    (acl,) = user["authorization"]["acls"]
    assert acl["resource"] == {
        "type": "topic",
        "name": topic,
        "patternType": pattern.removesuffix("ed"),
    }
    assert set(acl["operations"]) == operations
    # The topics the relay writes are under it: the template's fixed part.
    template = RelayConfig.__dataclass_fields__["topic_template"].default
    assert template.startswith(topic)
    for obj in rendered_strimzi:
        if obj["kind"] == "KafkaTopic":
            assert obj["spec"]["topicName"] == template.format(aggregatetype="scoring_job")
            assert obj["spec"]["config"]["min.insync.replicas"] < obj["spec"]["replicas"]


def test_the_strimzi_relays_mount_what_their_settings_name(
    rendered_strimzi: list[dict[str, Any]],
) -> None:
    user = one(rendered_strimzi, "KafkaUser", "outbox-relay")
    cluster = user["metadata"]["labels"]["strimzi.io/cluster"]
    config = one(rendered_strimzi, "ConfigMap", "outbox-relay-config")["data"]
    assert config["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert config["KAFKA_SASL_MECHANISM"].lower() == user["spec"]["authentication"]["type"]
    assert config["KAFKA_SASL_USERNAME"] == user["metadata"]["name"]
    assert config["OUTBOX_RELAY_REQUIRE_VERIFIED_TRANSPORT"] == "on"
    assert config["KAFKA_BOOTSTRAP_SERVERS"].startswith(f"{cluster}-kafka-bootstrap.")
    # Each file a setting names is a key of the Secret Strimzi (or you) writes.
    wanted = {
        config["KAFKA_SSL_CAFILE"]: (f"{cluster}-cluster-ca-cert", "ca.crt"),
        config["KAFKA_SASL_PASSWORD_FILE"]: (user["metadata"]["name"], "password"),
    }
    relay = _pod(one(rendered_strimzi, "Deployment", "outbox-relay"))
    (container,) = relay["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    wanted[env["PGSSLROOTCERT"]] = ("outbox-relay-postgres-ca", "ca.crt")
    volumes = {v["name"]: v for v in relay["volumes"]}
    for path, (secret, key) in wanted.items():
        directory, _, file = path.rpartition("/")
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
        assert mount["readOnly"] is True
        source = volumes[mount["name"]]["secret"]
        assert source["secretName"] == secret, path
        assert file == key and (
            key in {i["key"] for i in source.get("items", [])} or not source.get("items")
        )
    sidecar = _pod(one(rendered_strimzi, "Deployment", "outbox-relay-sidecar"))
    (container,) = sidecar["containers"]
    assert {e["name"]: e.get("value") for e in container["env"]}["PGSSLROOTCERT"] == env[
        "PGSSLROOTCERT"
    ]


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


@pytest.mark.parametrize("directory", OVERLAYS, ids=["example", "strimzi"])
def test_every_file_the_overlay_reads_is_in_it(directory: Path) -> None:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    for generator in kustomization["configMapGenerator"] + kustomization["secretGenerator"]:
        for name in generator.get("envs", []) + generator.get("files", []):
            assert (directory / name).is_file(), name
