"""The suite's fixtures live in tests/support: the real services (PostgreSQL, Kafka,
PgBouncer), a migrated database per test and a topic namespace per test. ``pytester``
runs small suites of its own in the tests of that support."""

pytest_plugins = ("pytester", "tests.support.services")
