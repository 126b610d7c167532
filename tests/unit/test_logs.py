"""Log lines: an exception by its type and where it was raised (its whole traceback, still
without any message, at debug level); the Kafka client's warnings and errors without its
reconnect noise, never its debug lines; asyncio's reports without the reprs that carry an
exception's text; the current span's trace and span ids on a line logged inside it."""

from __future__ import annotations

import ast
import io
import json
import logging
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiokafka
import pytest
from opentelemetry.sdk.trace import TracerProvider

import relay.retry
from contracts.unexpected import (
    PRODUCT_PACKAGES,
    exception_type,
    log_unexpected,
    raised_at,
    safe_traceback,
    unexpected_fields,
)
from outbox_relay.logs import KAFKA_RECONNECT_NOISE, JsonFormatter, configure_logging

REPO = Path(__file__).resolve().parents[2]
SECRET = "postgresql://relay:s3cr3t@db.internal/app"


class _Raising:
    """An rng whose draw fails with a secret in its text, so the error passes through a
    frame of the product (relay/retry.py) on its way out."""

    def randint(self, *_: int) -> int:
        raise RuntimeError(SECRET)


def _line_of(path: Path, text: str) -> int:
    lines = path.read_text(encoding="utf-8").splitlines()
    (number,) = [n for n, line in enumerate(lines, 1) if text in line]
    return number


def raised_through_the_product() -> RuntimeError:
    try:
        relay.retry.backoff_ms(1, base_ms=10, cap_ms=100, rng=_Raising())  # type: ignore[arg-type]
    except RuntimeError as exc:
        return exc
    raise AssertionError("did not raise")


def chained() -> BaseException:
    try:
        try:
            raise KeyError(SECRET)
        except KeyError as inner:
            raise ValueError(SECRET) from inner
    except ValueError as outer:
        return outer


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """What configure_logging's handler writes; the root logger is put back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    kafka = logging.getLogger("aiokafka")
    kafka_level = kafka.level
    stream = io.StringIO()
    try:
        yield stream
    finally:
        root.handlers[:], root.level = handlers, level
        kafka.setLevel(kafka_level)


def configured(stream: io.StringIO, level: str, fmt: str = "json") -> None:
    configure_logging(level, fmt)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)


def lines_of(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


# -- the exception's type and place ----------------------------------------------------------
def test_the_place_is_the_innermost_frame_of_the_product() -> None:
    exc = raised_through_the_product()
    line = _line_of(REPO / "relay" / "retry.py", "return (rng or random).randint(")
    assert raised_at(exc) == f"relay/retry.py:{line}"
    assert unexpected_fields(exc) == {"exc_type": "RuntimeError", "at": f"relay/retry.py:{line}"}


def test_a_library_type_is_named_with_its_module() -> None:
    assert exception_type(json.JSONDecodeError("m", "d", 0)) == "json.decoder.JSONDecodeError"
    assert exception_type(KeyError()) == "KeyError"


def test_an_exception_group_stands_for_its_first_error() -> None:
    exc = raised_through_the_product()
    group = BaseExceptionGroup("tasks", [KeyboardInterrupt(), ExceptionGroup("inner", [exc])])
    assert unexpected_fields(group)["exc_type"] == "RuntimeError"
    assert unexpected_fields(group)["at"].startswith("relay/retry.py:")


def test_the_safe_traceback_has_every_frame_and_type_and_no_message() -> None:
    exc = chained()
    text = safe_traceback(exc)
    assert SECRET not in text and "s3cr3t" not in text
    assert "KeyError (message not shown)" in text
    assert "ValueError (message not shown)" in text
    assert "The above exception was the direct cause of the following exception:" in text
    assert 'File "tests/unit/test_logs.py"' in text
    assert "in chained" in text
    group = ExceptionGroup("tasks", [raised_through_the_product(), exc])
    grouped = safe_traceback(group)
    assert SECRET not in grouped
    assert "relay/retry.py" in grouped and "ValueError (message not shown)" in grouped


def test_the_packages_of_the_product_are_those_the_distribution_ships() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    included = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {name.rstrip("*") for name in included} == set(PRODUCT_PACKAGES)


@pytest.mark.parametrize("level", ["info", "debug"])
def test_log_unexpected_names_type_and_place_with_the_traceback_only_at_debug(
    captured: io.StringIO, level: str
) -> None:
    configured(captured, level)
    log_unexpected(logging.getLogger("relay.engine"), "publish failed", chained(), events=3)
    (line,) = lines_of(captured)
    assert line["msg"] == "publish failed" and line["events"] == 3
    assert line["exc_type"] == "ValueError"
    assert line["at"].startswith("tests/unit/test_logs.py:")
    assert ("traceback" in line) is (level == "debug")
    assert SECRET not in captured.getvalue()


@pytest.mark.parametrize(("level", "fmt"), [("info", "json"), ("debug", "json"), ("debug", "text")])
def test_any_line_logged_with_an_exception_shows_its_type_and_place_not_its_text(
    captured: io.StringIO, level: str, fmt: str
) -> None:
    configured(captured, level, fmt)
    try:
        raise raised_through_the_product()
    except RuntimeError:
        logging.getLogger("aiokafka.producer.sender").exception("Unexpected error in sender")
    text = captured.getvalue()
    assert SECRET not in text
    assert "RuntimeError" in text and "relay/retry.py:" in text
    assert ("Traceback (most recent call last):" in text) is (level == "debug")


# -- the Kafka client's own lines ------------------------------------------------------------
def _kafka_record(logger: str, level: int, msg: str, *args: object) -> None:
    logging.getLogger(logger).log(level, msg, *args)


@pytest.mark.parametrize("noise", sorted(KAFKA_RECONNECT_NOISE))
def test_reconnect_noise_is_dropped_at_info_and_shown_at_debug(
    captured: io.StringIO, noise: str
) -> None:
    args = tuple("x" for _ in range(noise.count("%")))
    configured(captured, "info")
    _kafka_record("aiokafka.client", logging.ERROR, noise, *args)
    assert captured.getvalue() == ""
    configured(captured, "debug")
    _kafka_record("aiokafka.client", logging.ERROR, noise, *args)
    assert len(lines_of(captured)) == 1


def test_each_noise_line_is_one_the_installed_aiokafka_logs() -> None:
    # Matched on the format string: one aiokafka rewords is no longer dropped, and this says so.
    logged: set[str] = set()
    for path in Path(aiokafka.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("warning", "error", "exception")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                logged.add(str(node.args[0].value))
    assert not KAFKA_RECONNECT_NOISE - logged, sorted(KAFKA_RECONNECT_NOISE - logged)


@pytest.mark.parametrize("level", ["info", "warning", "debug"])
def test_the_kafka_clients_warnings_and_errors_are_logged_its_debug_never(
    captured: io.StringIO, level: str
) -> None:
    configured(captured, level)
    _kafka_record(
        "aiokafka.cluster", logging.ERROR, "Error fetching metadata for topic %s: %s", "t", "E"
    )
    _kafka_record("aiokafka.producer.sender", logging.WARNING, "Could not send %r: %r", "R", "E")
    _kafka_record("aiokafka.conn", logging.DEBUG, "%s Request %d: %s", "c", 1, "SaslAuthenticate")
    logged = lines_of(captured)
    assert [line["level"] for line in logged] == ["error", "warning"]
    assert "SaslAuthenticate" not in captured.getvalue()


def test_at_error_level_the_kafka_clients_warnings_are_left_out(captured: io.StringIO) -> None:
    configured(captured, "error")
    _kafka_record("aiokafka.producer.sender", logging.WARNING, "Could not send %r: %r", "R", "E")
    _kafka_record("aiokafka.producer.sender", logging.ERROR, "Unexpected error in sender routine")
    assert [line["level"] for line in lines_of(captured)] == ["error"]


# -- asyncio's reports -------------------------------------------------------------------------
def test_asyncios_report_of_an_unretrieved_exception_keeps_no_repr(captured: io.StringIO) -> None:
    configured(captured, "debug")
    exc = raised_through_the_product()
    logging.getLogger("asyncio").error(
        "Task exception was never retrieved\nfuture: <Task finished exception=%r>",
        exc,
        exc_info=exc,
    )
    logging.getLogger("asyncio").error(
        "Exception in callback Sender._fail_all(<Task finished exception=%r>)", exc, exc_info=exc
    )
    first, second = lines_of(captured)
    assert first["msg"] == "Task exception was never retrieved"
    assert second["msg"] == "Exception in callback Sender._fail_all"
    assert first["exc_type"] == "RuntimeError" and "traceback" in first
    assert SECRET not in captured.getvalue()


def test_the_json_formatter_alone_still_keeps_exception_text_out() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, None)
    exc = chained()
    record.exc_info = (type(exc), exc, exc.__traceback__)
    line = json.loads(JsonFormatter().format(record))
    assert line["exc_type"] == "ValueError" and SECRET not in json.dumps(line)


# -- trace context -----------------------------------------------------------------------------
def test_a_line_logged_in_a_span_carries_its_trace_and_span_ids(captured: io.StringIO) -> None:
    configured(captured, "info")
    tracer = TracerProvider().get_tracer("test")
    log = logging.getLogger("outbox_relay.test")
    log.info("before")
    with tracer.start_as_current_span("send") as span:
        log.info("inside", extra={"events": 1})
        context = span.get_span_context()
    log.info("after")
    before, inside, after = lines_of(captured)
    assert "trace_id" not in before and "span_id" not in before
    assert inside["trace_id"] == f"{context.trace_id:032x}"
    assert inside["span_id"] == f"{context.span_id:016x}"
    assert len(inside["trace_id"]) == 32 and len(inside["span_id"]) == 16
    assert inside["events"] == 1
    assert "trace_id" not in after


def test_a_text_line_in_a_span_names_the_ids_too(captured: io.StringIO) -> None:
    configured(captured, "info", fmt="text")
    with TracerProvider().get_tracer("test").start_as_current_span("send") as span:
        logging.getLogger("outbox_relay.test").info("inside")
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert f"trace_id={trace_id}" in captured.getvalue()
