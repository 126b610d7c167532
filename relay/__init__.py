"""outbox-relay: publishes committed transactional-outbox rows from PostgreSQL to Kafka."""

__version__ = "0.1.0"
