"""The range of every integer setting, declared once, on the field it bounds.

A setting's field says its range: ``batch_size: Positive = 1000`` (or any
``Annotated[int, msgspec.Meta(ge=…, le=…)]``). The command line reads it from there for
the flag that fills the field (outbox_relay/flags.py), the settings value checks it when
built (:func:`check_ranges`), and the health policy's bounds share :data:`MAX_SETTING`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Annotated, Final

import msgspec

from contracts.errors import ConfigError

MAX_SETTING: Final = 10**15
"""Larger settings and bounds are typos, and would overflow bigint limits and interval
arithmetic."""
INT4_MAX: Final = 2**31 - 1
"""PostgreSQL integer (int4): a setting bound as one never exceeds it."""

Positive = Annotated[int, msgspec.Meta(ge=1, le=MAX_SETTING)]
"""A count or a duration: at least 1."""
NotNegative = Annotated[int, msgspec.Meta(ge=0, le=MAX_SETTING)]
"""0 or more: 0 turns something off or makes it happen every time."""
PositiveInt4 = Annotated[int, msgspec.Meta(ge=1, le=INT4_MAX)]
"""At least 1, and bound as a PostgreSQL integer."""


_FOUND: dict[type, Mapping[str, tuple[int, int]]] = {}


def ranges(settings: type) -> Mapping[str, tuple[int, int]]:
    """Each ranged field of the class ``settings`` and its (least, greatest) value, in
    declaration order."""
    if settings in _FOUND:
        return _FOUND[settings]
    found = {}
    for name, hint in typing.get_type_hints(settings, include_extras=True).items():
        meta = _meta(hint)
        if meta is not None:
            if not isinstance(meta.ge, int) or not isinstance(meta.le, int):
                raise TypeError(f"{settings.__name__}.{name}: a range needs integer ge and le")
            found[name] = (meta.ge, meta.le)
    _FOUND[settings] = types.MappingProxyType(found)
    return _FOUND[settings]


def _meta(hint: object) -> msgspec.Meta | None:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # int | None
        return next(filter(None, map(_meta, typing.get_args(hint))), None)
    if typing.get_origin(hint) is Annotated:
        return next(
            (m for m in getattr(hint, "__metadata__", ()) if isinstance(m, msgspec.Meta)), None
        )
    return None


def check_range(name: str, value: int, minimum: int, maximum: int) -> int:
    """``value``, or a :class:`ConfigError` naming ``name`` when it is below ``minimum`` (1:
    positive, 0: not negative) or above ``maximum``."""
    if value < minimum:
        rule = "be a positive integer" if minimum > 0 else "not be negative"
        raise ConfigError(f"{name} must {rule}, got {value}")
    if value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {value}")
    return value


def flag_of(field: str) -> str:
    """The flag that fills a settings field of the same name: ``--batch-size``."""
    return "--" + field.replace("_", "-")


def check_ranges(settings: object, flags: Mapping[str, str] | None = None) -> None:
    """Refuse a ranged field of ``settings`` that is outside its range (None is no value),
    naming it by the flag that fills it (:func:`flag_of`, unless ``flags`` names another)."""
    for name, (minimum, maximum) in ranges(type(settings)).items():
        value = getattr(settings, name)
        if value is not None:
            check_range((flags or {}).get(name) or flag_of(name), value, minimum, maximum)
