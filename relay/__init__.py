"""The relay engine: publishes committed transactional-outbox rows from PostgreSQL to Kafka."""
