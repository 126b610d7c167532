"""outbox-relay: the product's composition root (CLI verbs, the process, the demo, logging).

The only package that imports more than one of ``relay``, ``health`` and ``scoring``.
"""

from contracts import __version__

__all__ = ["__version__"]
