"""Keep a server process's start-up objects out of the garbage collector's full passes.

Once the app has started, the process holds about 150,000 objects that live as long as it does
(modules, the app and its routes, SQLAlchemy's and msgspec's structures). CPython's cyclic
collector walks every one of them at each full (generation 2) collection, which runs from time to
time under load and stops the event loop meanwhile, a pause paid by every request in flight
(bench/README.md has the figures). `gc.freeze()` moves them to a permanent generation that
collections skip; garbage made later is still collected as before.

Requests that live long (waiting pops hold theirs up to `[pops] wait_max_seconds`) still reach
the oldest generation by the thousand, and CPython then runs a full collection every ten middle
ones, each walking every request in flight: with 2,000 waiting pops, a pause of about 150 ms every
few seconds. A full collection is therefore asked for ten times less often (`FULL_EVERY`);
garbage without cycles is freed at once as before, and only cyclic garbage that outlived two young
collections waits longer for its full collection.
"""

from __future__ import annotations

import gc

_frozen = False
# Middle-generation collections between two full ones (CPython's default: 10).
FULL_EVERY = 100


def freeze_startup_objects() -> None:
    """Collect the start-up garbage, then freeze what is left, and space the full collections out.
    Once per process: a process that starts several apps (the test suite) would otherwise freeze the
    earlier apps' objects, which it may still free."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_EVERY)
