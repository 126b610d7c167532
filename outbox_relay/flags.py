"""The flag framework: one declared flag is its command-line argument, its environment
variable and its default, read in one way everywhere.

A flag wins over its variable, and an empty variable counts as unset. An integer flag's
range is the one declared on the settings field it ``fills`` (contracts/ranges.py), read
here rather than written again. The flags themselves are declared in
outbox_relay/options.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from contracts.errors import ConfigError
from contracts.ranges import check_range, ranges
from relay.config import require_utf8

Environ = Mapping[str, str]
_T = TypeVar("_T")


def dest_of(flag: str) -> str:
    """The attribute argparse stores ``flag`` under: ``--batch-size`` → ``batch_size``."""
    return flag.removeprefix("--").replace("-", "_")


@dataclass(frozen=True, kw_only=True)
class Option:
    """One flag: the verbs that take it, its environment variable and its help."""

    flag: str
    verbs: frozenset[str]
    help: str
    env: str | None = None
    # A second variable read when the flag and ``env`` are unset; its resolver says how.
    fallback_env: str | None = None
    # A default that is no single value ("random per process"), as help and docs/cli.md say it.
    default_text: str | None = None
    group: str | None = None

    @property
    def dest(self) -> str:
        """The attribute argparse stores the flag under (and the RelayConfig field, if any)."""
        return dest_of(self.flag)

    @property
    def default_value(self) -> object:
        """The value used when neither the flag nor a variable is given."""
        return None

    def add_to(self, container: Any) -> None:
        """Add this flag to a parser or an argument group."""
        container.add_argument(self.flag, default=None, help=self.help_text())

    def help_text(self) -> str:
        """The help line: what it is, its variables and its default."""
        notes = []
        if self.env:
            notes.append(f"{self.env}, else {self.fallback_env}" if self.fallback_env else self.env)
        default = self.default_text or self.default_value
        if default is not None and default is not False:
            notes.append(f"default {default}")
        return f"{self.help} ({'; '.join(notes)})" if notes else self.help

    def given(self, args: argparse.Namespace) -> Any:
        """The flag's value, or None when it was not given (an empty value counts as not given)."""
        value = vars(args)[self.dest]
        if value in (None, ""):
            return None
        for text in value if isinstance(value, list) else (value,):
            _require_utf8(self.flag, text)
        return value

    def from_env(self, environ: Environ) -> str | None:
        """The variable's text, or None when it is unset or empty."""
        value = (environ.get(self.env) or None) if self.env else None
        return _require_utf8(self.env or self.flag, value)

    def fallback(self, environ: Environ) -> str | None:
        """The fallback variable's text, or None when it is unset or empty."""
        value = (environ.get(self.fallback_env) or None) if self.fallback_env else None
        return _require_utf8(self.fallback_env or self.flag, value)


def _require_utf8(name: str, value: _T) -> _T:
    """``value`` itself, once :func:`relay.config.require_utf8` found it UTF-8 text."""
    if isinstance(value, str):
        require_utf8((name, value))
    return value


@dataclass(frozen=True, kw_only=True)
class Text(Option):
    """A flag with a text value."""

    default: str | None = None
    choices: tuple[str, ...] = ()
    # Set on a flag that has no default and must be given: why, for the error line.
    required_because: str | None = None

    @property
    def default_value(self) -> object:
        """The value used when neither the flag nor a variable is given."""
        return self.default

    def add_to(self, container: Any) -> None:
        """Add this flag to a parser or an argument group."""
        container.add_argument(
            self.flag, default=None, choices=self.choices or None, help=self.help_text()
        )

    def explicit(self, args: argparse.Namespace, environ: Environ) -> str | None:
        """The flag, else the variable; None when neither is given."""
        given = self.given(args)
        if given is not None:
            return str(given)  # argparse checked the choices
        value = self.from_env(environ)
        if value is not None and self.choices and value not in self.choices:
            raise ConfigError(f"{self.env} must be one of {', '.join(self.choices)}")
        return value

    def value(self, args: argparse.Namespace, environ: Environ) -> str | None:
        """The flag, else the variable, else the default."""
        return self.explicit(args, environ) or self.default

    def required(self, args: argparse.Namespace, environ: Environ) -> str:
        """The value, or a :class:`ConfigError` naming the flag and its variable."""
        value = self.value(args, environ)
        if value is None:
            why = f": {self.required_because}" if self.required_because else ""
            raise ConfigError(f"{self.flag} ({self.env}) is required{why}")
        return value


@dataclass(frozen=True, kw_only=True)
class Integer(Option):
    """A flag with an integer value, a default and the range of the settings field it fills."""

    default: int
    fills: tuple[type, str]
    """The settings class and field this flag's value goes to; their range is the flag's."""

    @property
    def minimum(self) -> int:
        """The least value the flag takes."""
        return ranges(self.fills[0])[self.fills[1]][0]

    @property
    def maximum(self) -> int:
        """The greatest value the flag takes."""
        return ranges(self.fills[0])[self.fills[1]][1]

    @property
    def default_value(self) -> object:
        """The value used when neither the flag nor a variable is given."""
        return self.default

    def add_to(self, container: Any) -> None:
        """Add this flag to a parser or an argument group."""
        container.add_argument(self.flag, type=int, default=None, help=self.help_text())

    def value(self, args: argparse.Namespace, environ: Environ) -> int:
        """The flag (argparse checked it is an integer), else the variable, else the
        default; a :class:`ConfigError` when it is out of range."""
        given = self.given(args)
        if given is not None:
            return self._in_range(self.flag, int(given))
        raw = self.from_env(environ)
        if raw is None:
            return self.default
        try:
            number = int(raw)
        except ValueError:
            raise ConfigError(f"{self.env} must be an integer") from None
        return self._in_range(f"{self.env}", number)

    def _in_range(self, name: str, number: int) -> int:
        return check_range(name, number, self.minimum, self.maximum)


# What a switch's variable may say, in any letter case; anything else is refused.
SWITCH_ON = ("1", "true", "yes", "on")
SWITCH_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True, kw_only=True)
class Switch(Option):
    """A flag without a value; its variable says on (1, true, yes, on) or off (0, false,
    no, off), in any letter case."""

    def add_to(self, container: Any) -> None:
        """Add this flag to a parser or an argument group."""
        container.add_argument(self.flag, action="store_true", default=None, help=self.help_text())

    def value(self, args: argparse.Namespace, environ: Environ) -> bool:
        """On when the flag is given or the variable says so; a :class:`ConfigError` when
        the variable says neither on nor off."""
        raw = self.from_env(environ)
        on = raw is not None and self._read(raw)
        return self.given(args) is not None or on

    def _read(self, raw: str) -> bool:
        word = raw.lower()
        if word in SWITCH_ON:
            return True
        if word in SWITCH_OFF:
            return False
        # Not echoed: it is whatever the environment held, and the rule is short.
        raise ConfigError(
            f"{self.env} must say on ({', '.join(SWITCH_ON)}) or off "
            f"({', '.join(SWITCH_OFF)}), in any letter case"
        )


@dataclass(frozen=True, kw_only=True)
class Repeated(Option):
    """A flag that may be given several times; no variable."""

    def add_to(self, container: Any) -> None:
        """Add this flag to a parser or an argument group."""
        container.add_argument(self.flag, action="append", default=None, help=self.help_text())

    def values(self, args: argparse.Namespace) -> list[str]:
        """Every value given, in order."""
        return list(vars(args)[self.dest] or [])
