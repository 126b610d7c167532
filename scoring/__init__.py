"""Scoring outcome writer and a small worker SDK over the scoring service's job table.

A completion or permanent failure and its outbox event commit in one transaction; see
docs/writer.md for the contract and the event payload.
"""
