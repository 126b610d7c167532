"""The service orchestrator: real PostgreSQL 15 and 18, Apache Kafka and PgBouncer for
development, the tests and the soak, without Docker.

Each service is declared once (:mod:`~scripts.services.declaration`): what it installs,
its settings (a running one of ours with other settings is restarted), how it starts, how
it is checked and how it stops. Every cluster and process is this checkout's own, on the
ports of :mod:`~scripts.services.plan`; nothing another project or the machine runs is
used or reconfigured. ``python -m scripts.services --help`` for the commands.
"""
