"""tests/support/services.py: every test that uses a service fixture, directly or through
another fixture, is marked ``services``, and tests/unit holds none."""

from __future__ import annotations

import pytest

PLUGIN = 'pytest_plugins = ("tests.support.services",)\n'
INI = """[pytest]
addopts = --strict-markers
asyncio_default_fixture_loop_scope = session
markers = services: as in pyproject.toml
"""

TESTS = """
import pytest

@pytest.fixture
def through_another(db):
    return db

def test_pure():
    pass

def test_database(database_url):
    pass

def test_broker(kafka_bootstrap):
    pass

def test_pooler(pgbouncer):
    pass

def test_indirect(through_another):
    pass

@pytest.mark.services
def test_starts_its_own():
    pass
"""


def _collected(pytester: pytest.Pytester, *args: str) -> set[str]:
    """The test names a collection selects (parameters, such as each server, left out)."""
    result = pytester.runpytest_inprocess("--collect-only", "-q", *args)
    return {line.split("::")[1].split("[")[0] for line in result.outlines if "::" in line}


def test_the_service_fixtures_mark_the_tests_that_use_them(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(PLUGIN)
    pytester.makeini(INI)
    pytester.makepyfile(test_mixed=TESTS)
    assert _collected(pytester, "-m", "services") == {
        "test_database",
        "test_broker",
        "test_pooler",
        "test_indirect",
        "test_starts_its_own",
    }
    assert _collected(pytester, "-m", "not services") == {"test_pure"}


def test_a_test_under_tests_unit_that_needs_a_service_is_refused(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(PLUGIN)
    pytester.makeini(INI)
    unit = pytester.mkpydir("tests")
    (unit / "unit").mkdir()
    (unit / "unit" / "test_quick.py").write_text("def test_reads(db):\n    pass\n")
    (unit / "unit" / "test_pure.py").write_text("def test_pure():\n    pass\n")
    result = pytester.runpytest_inprocess("--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*needs a service but sits in tests/unit*tests/unit/test_quick.py::test_reads*"]
    )
