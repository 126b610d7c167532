"""Health sidecar: probe → classify → compose for the outbox, the scoring queue and the relay."""
