"""How much memory a new allocation may use, and refusing a problem that would not fit.

The naive functions hold (n_q, n_k) matrices; they ask :func:`check_fits_in_memory` before
allocating them, so that a problem too large raises a clear MemoryError instead of swapping
or being killed.  :data:`MEMORY_LIMIT` overrides what the operating system reports (tests set it).
"""

from __future__ import annotations

import os

__all__ = ["MEMORY_LIMIT", "available_memory", "check_fits_in_memory"]


#: When set (bytes), the memory the naive functions may ask for, instead of the available
#: memory the operating system reports (see :func:`available_memory`).
MEMORY_LIMIT: int | None = None


def available_memory() -> int | None:
    """Bytes of memory a new allocation can use without swapping, or None when unknown.

    :data:`MEMORY_LIMIT` if set; else Linux's ``MemAvailable`` (/proc/meminfo), else the
    physical memory ``os.sysconf`` reports (macOS and other POSIX systems); else None.
    """
    if MEMORY_LIMIT is not None:
        return int(MEMORY_LIMIT)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def check_fits_in_memory(nbytes: int, what: str) -> None:
    """Refuse, before allocating, arrays of ``nbytes`` that exceed :func:`available_memory`."""
    limit = available_memory()
    if limit is not None and nbytes > limit:
        raise MemoryError(
            f"this problem needs {nbytes:,} bytes ({nbytes / 2**30:,.1f} GiB) for {what}, "
            f"more than the {limit:,} bytes ({limit / 2**30:,.1f} GiB) of memory available; "
            "use flash_attention (O(n) memory) or a smaller problem"
        )
