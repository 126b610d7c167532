"""Developer scripts: the service orchestrator (``scripts.services``) and small helpers."""
