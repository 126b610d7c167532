"""The one home of what tests share; a test imports from here, never from another test
folder's modules.

- ``services``: the real services as fixtures (a pytest plugin), the ``services`` marker,
  scratch databases;
- ``waiting``: ``wait_until`` (and ``wait_until_blocking``) for a condition,
  ``wait_for_signal`` for a moment the relay signals (relay/signals.py);
- ``ports``: ``free_port``;
- ``kafka``: ``read_topic``, a topic's records from the beginning; ``create_topics`` and
  ``kafka_admin``;
- ``kafka_acl`` and ``tls``: topics with ACLs on the secured listeners, the services' CA
  and one nobody trusts;
- ``rows``: ``make_row``, an ``OutboxRow`` built in memory;
- ``policies``: ``loose_policy``, ``relay_policy``, the sidecar's receipt retention;
- ``health_rows``: scoring jobs, outbox rows and receipts as the probes read them, with
  recognisable refs (``insert_job``, ``insert_event``, ``insert_receipt``);
- ``scoring_jobs``: a scoring job brought to a state through the writer, and read back;
- ``cli``: ``outbox-relay`` as one process (``run_cli``, ``cli_env``, ``run_service_cli``),
  login roles and URLs to hand it, the migrations this release ships;
- ``roles`` and ``expected_privileges``: login roles granted a part, what a role may do
  on every object, and the matrix each part must hold;
- ``monitoring_kit``: docs/monitoring's rules and dashboard queries, and the metric names
  a PromQL expression reads;
- ``relay``: a relay in the test's event loop (``running_relay``, ``fast_config``);
- ``processes``: ``outbox-relay run`` as processes (``Relays``);
- ``order``: writers that count each key's commits, and the per-key order check;
- ``http``: a raw HTTP/1.1 client, and how promptly a health probe must answer;
- ``faultproxy`` and ``kafka_paths``: a TCP proxy that stalls, heals and cuts a path, and
  the broker listeners it can sit in front of;
- ``running``: ``outbox-relay`` verbs as processes of some release's code (``running``,
  ``run_verb``, ``Code``);
- ``release``: the previous release checked out with ``git worktree``, and the next one
  (this checkout, with a migration planted when it reads none that is new:
  ``planted_release``);
- ``schema_levels``: the newest migration a part's statements read, found by PostgreSQL;
- ``migration_rules``: what a new migration must do not to hold writers up.

Its own tests are the ``test_*.py`` beside them.
"""
