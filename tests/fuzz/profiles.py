"""Hypothesis budgets for the fuzz tests: a fixed, derandomized one for CI and a long one.

CI runs the ``fuzz-ci`` profile: the same examples every run (``derandomize``), sized so
the whole fuzz suite stays near a minute and a half on a busy two-core machine.
``OUTBOX_RELAY_FUZZ=long`` selects ``fuzz-long``: random examples, twenty times as many,
for a local hunt. The profiles are applied per test (:func:`fuzz_settings`), never loaded
globally, so the other property tests keep their own settings.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = settings(
    deadline=None,
    # Fixtures (a database, a running relay) are shared by every example on purpose.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("fuzz-ci", _COMMON, derandomize=True, database=None)
settings.register_profile("fuzz-long", _COMMON, derandomize=False)

LONG = os.environ.get("OUTBOX_RELAY_FUZZ") == "long"
_PROFILE = settings.get_profile("fuzz-long" if LONG else "fuzz-ci")
_SCALE = 20 if LONG else 1


def fuzz_settings(max_examples: int) -> settings:
    """The selected profile with ``max_examples`` (CI) or twenty times as many (long)."""
    return settings(_PROFILE, max_examples=max_examples * _SCALE)
