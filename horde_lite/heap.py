"""Keep a server process's start-up objects out of the garbage collector's full passes.

Once the app has started, the process holds about 150,000 objects that live as long as it does
(modules, the app and its routes, SQLAlchemy's and msgspec's structures). CPython's cyclic
collector walks every one of them at each full (generation 2) collection, which runs from time to
time under load and stops the event loop meanwhile, a pause paid by every request in flight
(bench/README.md has the figures). `gc.freeze()` moves them to a permanent generation that
collections skip; garbage made later is still collected as before.
"""

from __future__ import annotations

import gc

_frozen = False


def freeze_startup_objects() -> None:
    """Collect the start-up garbage, then freeze what is left. Once per process: a process that
    starts several apps (the test suite) would otherwise freeze the earlier apps' objects, which it
    may still free."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
