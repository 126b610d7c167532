"""Process-wide settings the ``run`` verb makes once, before the service starts.

All are about the long-running process and nothing else: the verbs that run once and the
tests that run the service inside their own process keep the interpreter's defaults.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import os
from collections.abc import Callable

# glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# A block this large or larger is mapped on its own and unmapped when freed. Produce
# requests (1 MiB at most by default) and the rows of one fetch stay well below it.
MMAP_THRESHOLD_BYTES = 16 << 20
# Free memory at the top of the heap is handed back to the kernel only beyond this.
TRIM_THRESHOLD_BYTES = 32 << 20
# Young objects the collector lets accumulate before it runs: above what one batch of the
# default size (1,000 rows) allocates and keeps alive.
YOUNG_COLLECTION_THRESHOLD = 10_000
# Set by the operator, these win (glibc reads them at start-up): the relay sets nothing.
_OPERATOR_SETTINGS = ("GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


@functools.cache
def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``; None where the C library is another (musl, macOS)."""
    try:
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return None
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (ValueError, OSError, AttributeError):  # no such confstr name, no such library
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


def tune_allocator() -> bool:
    """Keep the memory of large, short-lived buffers for reuse instead of returning it to
    the kernel after every batch; returns whether the allocator was tuned.

    A drain builds and frees buffers of about a megabyte per batch (the rows of a fetch, a
    produce request and its copies). glibc maps blocks that large on their own and unmaps
    them when they are freed, and hands free memory at the top of its heap back to the
    kernel beyond 128 KiB (both thresholds grow with use, but not past the working set of
    one batch): every batch faulted the same pages in again, a trap into the kernel and a
    zeroed page each (docs/benchmarks.md#findings). The peak resident set does not grow:
    what is kept is what the peak already held.

    Nothing is set where the operator set glibc's own knobs, or where the C library is
    not glibc.
    """
    mallopt = _glibc_mallopt()
    if mallopt is None or any(name in os.environ for name in _OPERATOR_SETTINGS):
        return False
    # Setting one threshold stops glibc from moving the other: set both, mmap first.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


def freeze_startup_heap() -> int:
    """Move every object alive now (modules, classes, functions: what start-up built) out of
    the garbage collector's sight; returns how many it holds frozen.

    Those objects live as long as the process, yet each full collection walked all of
    them with the event loop stopped, and every event waiting meanwhile waited that long
    (docs/benchmarks.md#findings). Collected first, so nothing that is already garbage
    stays for good. Frozen objects are still freed when their last reference goes.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def space_young_collections() -> None:
    """Let the young generation grow to :data:`YOUNG_COLLECTION_THRESHOLD` objects before
    it is collected; the older generations keep the interpreter's ratios.

    Under a backlog nearly everything the relay allocates stays alive until its batch is
    recorded: the driver's records, the rows, the Kafka records and their headers, several
    thousand tracked objects per fetch. At the default of 700 each batch set off about
    eight young collections that freed nothing and carried it all into the older
    generations, whose collections then walked it again (docs/benchmarks.md#findings).
    Reference counting frees almost all of it anyway; the collector is only there for
    cycles.
    """
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``run`` runs on: uvloop's where it is installed (a dependency on every
    platform it supports), else None for the standard library's.

    The relay's CPU goes to the event loop's transports more than to its own code: every
    fetch, produce request and bookkeeping statement is a write and a read on a socket,
    and with TLS each passes through the standard library's SSL protocol, written in
    Python. uvloop implements both in C (libuv). The verbs that run once keep the
    standard library's loop.
    """
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
