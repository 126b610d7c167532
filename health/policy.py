"""Loading the operator's policy file, with one-line errors that name the exact field."""

from __future__ import annotations

import tomllib
from typing import Any, TypeVar

import msgspec

from contracts.errors import ConfigError
from contracts.policy import EvaluationSettings, Family, Policy
from contracts.ranges import MAX_SETTING
from health.families import REGISTRY

_EVALUATION = "evaluation"
_KNOWN_TOP = frozenset([*(f.value for f in Family), _EVALUATION])

S = TypeVar("S", bound=msgspec.Struct)


def load_policy(path: str) -> Policy:
    """Read and validate a policy TOML file; any problem is a one-line :class:`ConfigError`."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError as exc:
        raise ConfigError(f"policy file {_shown(path)} does not exist") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"policy file {_shown(path)} is a directory") from exc
    except OSError as exc:
        raise ConfigError(f"policy file {_shown(path)} cannot be read: {exc.strerror}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"policy file {_shown(path)} is not UTF-8") from exc
    return parse_policy(text)


def parse_policy(text: str) -> Policy:
    """Validate policy TOML text (see :func:`load_policy`)."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The decoder's message names a line and column, never a value.
        raise ConfigError(f"policy: invalid TOML: {exc}") from exc
    except RecursionError:
        # The decoder recurses per nesting level; no policy nests more than two deep.
        raise ConfigError("policy: invalid TOML: values nested too deeply") from None
    for key, value in document.items():
        if key not in _KNOWN_TOP:
            known = ", ".join(sorted(_KNOWN_TOP))
            raise ConfigError(f"policy: unknown section [{_shown(key)}] (known: {known})")
        if not isinstance(value, dict):
            raise ConfigError(f"policy: {key} must be a [{key}] table")
    families: dict[str, Any] = {}
    for family, spec in REGISTRY.items():
        section = document.get(family.value)
        if section is None:
            raise ConfigError(
                f"policy: [{family.value}] is missing; configure every bound or set enabled = false"
            )
        families[family.value] = _family(family.value, section, spec.policy_type)
    evaluation = _evaluation(document.get(_EVALUATION, {}))
    policy = Policy(**families, evaluation=evaluation)
    _cross_checks(policy)
    return policy


def _family(name: str, section: dict[str, Any], struct: type[S]) -> S | None:
    enabled = section.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"policy: [{name}] enabled must be true or false")
    fields = {f.name: f.type for f in msgspec.structs.fields(struct)}
    for key in section:
        if key != "enabled" and key not in fields:
            raise ConfigError(f"policy: [{name}] {_shown(key)} is not a known setting")
    for key, value in section.items():
        if key != "enabled":
            _check_type(name, key, value, fields[key])
    if not enabled:
        return None
    for key in fields:
        if key not in section:
            raise ConfigError(f"policy: [{name}] {key} is missing")
    return struct(**{k: v for k, v in section.items() if k != "enabled"})


def _evaluation(section: dict[str, Any]) -> EvaluationSettings:
    fields = {f.name: f.type for f in msgspec.structs.fields(EvaluationSettings)}
    for key, value in section.items():
        if key not in fields:
            raise ConfigError(f"policy: [{_EVALUATION}] {_shown(key)} is not a known setting")
        _check_type(_EVALUATION, key, value, fields[key])
        if value == 0:
            raise ConfigError(f"policy: [{_EVALUATION}] {key} must be greater than 0")
    return EvaluationSettings(**section)


def _shown(text: str) -> str:
    """A key or path as written, or quoted with escapes when it holds a line break or control."""
    return text if text.isprintable() else repr(text)


def _check_type(section: str, key: str, value: object, expected: object) -> None:
    if expected is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"policy: [{section}] {key} must be true or false")
        return
    # bool is an int subclass in Python; `max_x = true` is a typo, not a bound of 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"policy: [{section}] {key} must be an integer")
    if value < 0:
        raise ConfigError(f"policy: [{section}] {key} must not be negative")
    # The same ceiling as every setting's (contracts/ranges.py).
    if value > MAX_SETTING:
        raise ConfigError(f"policy: [{section}] {key} is too large")


def _cross_checks(policy: Policy) -> None:
    completion = policy.completion_outbox
    if completion is not None and completion.grace_ms >= completion.lookback_ms:
        raise ConfigError(
            "policy: [completion_outbox] grace_ms must be less than lookback_ms "
            "(otherwise no job is ever checked)"
        )
    evaluation = policy.evaluation
    if evaluation.max_evidence_age_ms < evaluation.interval_ms + evaluation.timeout_ms:
        raise ConfigError(
            "policy: [evaluation] max_evidence_age_ms must be at least interval_ms + timeout_ms "
            "(otherwise every report is stale before the next one arrives)"
        )
