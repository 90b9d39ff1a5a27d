"""How long a test waits for something to happen before it fails: one upper bound for every wait.

A wait polls for its event (a line said, a row written, a screen drawn, a process ended) and returns the
moment it happens; the bound only decides when a wait that will never end is called a failure. On a
two-core machine with other jobs (load 10-17) a child process's imports alone can take tens of seconds,
so the bound is generous; a test never asserts on how long a wait took.
"""

from __future__ import annotations

EVENT_WAIT_S = 120.0
