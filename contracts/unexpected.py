"""What an unexpected exception may show in a log: its type and where it came from, never
its text.

An exception's message can carry driver text, a URL with its password, a payload or a
key, so none is ever printed: not the exception's own, not those of the exceptions it was
raised from, not its notes. What is printed is the type, the innermost frame of this
product (``relay/records.py:128``) and, where debug logging is on, the whole traceback as
frames and types.
"""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any, Final

# The product's top-level packages (pyproject.toml's packages.find include, which
# tests/unit/test_logs.py holds this to) and the directory they sit in.
PRODUCT_PACKAGES: Final = (
    "outbox_relay",
    "relay",
    "health",
    "contracts",
    "scoring",
    "migrations",
    "pgconnect",
)
_ROOT: Final = Path(__file__).resolve().parent.parent
_PRODUCT_DIRS: Final = tuple(str(_ROOT / package) + "/" for package in PRODUCT_PACKAGES)
_MESSAGE_WITHHELD: Final = "(message not shown)"


def exception_type(exc: BaseException) -> str:
    """The exception's class name, with its module unless it is a built-in."""
    kind = type(exc)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _shown_path(filename: str) -> str:
    """A frame's file: relative to the product's root for the product, to its place on
    ``sys.path`` for a library (so a path shows no user's home or virtualenv)."""
    resolved = str(Path(filename).resolve()) if filename[:1] == "/" else filename
    if resolved.startswith(_PRODUCT_DIRS):
        return resolved[len(str(_ROOT)) + 1 :]
    roots = [entry for entry in sys.path if entry and resolved.startswith(entry.rstrip("/") + "/")]
    if roots:
        return resolved[len(max(roots, key=len).rstrip("/")) + 1 :]
    return Path(filename).name


def _is_product(filename: str) -> bool:
    resolved = str(Path(filename).resolve()) if filename[:1] == "/" else filename
    return resolved.startswith(_PRODUCT_DIRS)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for member in exc.exceptions for leaf in _leaves(member)]
    return [exc]


def innermost_error(exc: BaseException) -> BaseException:
    """The exception an exception group stands for: its first leaf that is an error (not a
    cancellation or an interrupt), else its first leaf; any other exception itself."""
    leaves = _leaves(exc) or [exc]
    return next((leaf for leaf in leaves if isinstance(leaf, Exception)), leaves[0])


def raised_at(exc: BaseException) -> str | None:
    """``file:line`` of the innermost frame of this product that ``exc`` passed through
    (a library's innermost frame when none did); None without a traceback."""
    frames = traceback.extract_tb(innermost_error(exc).__traceback__)
    if not frames:
        return None
    ours = [frame for frame in frames if _is_product(frame.filename)]
    frame = (ours or frames)[-1]
    return f"{_shown_path(frame.filename)}:{frame.lineno}"


def unexpected_fields(exc: BaseException, *, with_traceback: bool = False) -> dict[str, str]:
    """Log fields for ``exc``: ``exc_type``, ``at`` (see :func:`raised_at`) and, when asked,
    ``traceback`` (see :func:`safe_traceback`); never the exception's text."""
    leaf = innermost_error(exc)
    fields = {"exc_type": exception_type(leaf)}
    at = raised_at(leaf)
    if at is not None:
        fields["at"] = at
    if with_traceback:
        fields["traceback"] = safe_traceback(exc)
    return fields


def log_unexpected(
    logger: logging.Logger,
    message: str,
    exc: BaseException,
    *,
    level: int = logging.ERROR,
    **extra: Any,
) -> None:
    """Log ``message`` once for ``exc``: its type and where it was raised, plus ``extra``;
    with the whole traceback (frames and types, no messages) when ``logger`` logs debug."""
    fields = unexpected_fields(exc, with_traceback=logger.isEnabledFor(logging.DEBUG))
    logger.log(level, message, extra={**extra, **fields})


def safe_traceback(exc: BaseException) -> str:
    """The traceback of ``exc``, of what it was raised from or during, and of a group's
    members: every frame (file, line, function, source line) and every type, no message."""
    lines: list[str] = []
    _append_chain(exc, lines, "", set())
    return "\n".join(lines)


def _append_chain(exc: BaseException, lines: list[str], indent: str, seen: set[int]) -> None:
    seen.add(id(exc))
    cause = exc.__cause__
    context = None if exc.__suppress_context__ else exc.__context__
    if cause is not None and id(cause) not in seen:
        _append_chain(cause, lines, indent, seen)
        lines.append(
            f"{indent}The above exception was the direct cause of the following exception:"
        )
    elif context is not None and id(context) not in seen:
        _append_chain(context, lines, indent, seen)
        lines.append(f"{indent}During handling of the above exception, another exception occurred:")
    _append_frames(exc.__traceback__, lines, indent)
    lines.append(f"{indent}{exception_type(exc)} {_MESSAGE_WITHHELD}")
    if isinstance(exc, BaseExceptionGroup):
        for number, member in enumerate(exc.exceptions, 1):
            lines.append(f"{indent}+---------------- {number} ----------------")
            _append_chain(member, lines, indent + "| ", seen)


def _append_frames(tb: TracebackType | None, lines: list[str], indent: str) -> None:
    if tb is None:
        return
    lines.append(f"{indent}Traceback (most recent call last):")
    for frame in traceback.extract_tb(tb):
        lines.append(
            f'{indent}  File "{_shown_path(frame.filename)}", line {frame.lineno}, in {frame.name}'
        )
        if frame.line:
            lines.append(f"{indent}    {frame.line.strip()}")
