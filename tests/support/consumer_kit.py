"""docs/asyncapi.yaml and docs/schemas as a consumer's validator reads them: the document's
message headers (AsyncAPI schemas, JSON Schema draft-07) and the scoring events' payload
schema (JSON Schema 2020-12), each as a validator of real records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
ASYNCAPI = REPO / "docs" / "asyncapi.yaml"
OUTCOME_SCHEMA = REPO / "docs" / "schemas" / "scoring-outcome-event.schema.json"


def asyncapi_document() -> dict[str, Any]:
    """docs/asyncapi.yaml, loaded."""
    loaded: dict[str, Any] = yaml.safe_load(ASYNCAPI.read_text())
    return loaded


def headers_validator(schema: str) -> jsonschema.Draft7Validator:
    """A validator of a record's headers (name → text) against one of the document's
    header schemas (``components.schemas.<schema>``), its references resolved in it."""
    root = {"$ref": f"#/components/schemas/{schema}", **asyncapi_document()}
    return jsonschema.Draft7Validator(root, format_checker=jsonschema.FormatChecker())


def outcome_validator() -> jsonschema.Draft202012Validator:
    """A validator of a scoring outcome event's value against the generated schema."""
    schema = json.loads(OUTCOME_SCHEMA.read_text())
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def errors(validator: jsonschema.protocols.Validator, instance: object) -> list[str]:
    """Every schema error, as one line each."""
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(instance)]
