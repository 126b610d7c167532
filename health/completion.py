"""The former home of :class:`CompletionTracker`, kept so that existing imports still work.

The tracker lives in :mod:`health.families.completion_tracker`; import it from there.
"""

from __future__ import annotations

from health.families.completion_tracker import CompletionTracker

__all__ = ["CompletionTracker"]
