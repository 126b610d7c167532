"""Numbered plain-SQL migrations (``NNNN_name.sql``), shipped as package data."""
