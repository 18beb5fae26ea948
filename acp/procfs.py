"""One scan of Linux ``/proc``: every process's state, parent and process group.

Blocking (it reads one small file per process): call it from a worker thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterator


def stats() -> Iterator[tuple[int, bytes, int, int]]:
    """``(pid, state, ppid, pgid)`` of every process that can still be read."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 3:
            yield int(entry), fields[0], int(fields[1]), int(fields[2])
