"""`python -m horde_lite.worker ...` is `horde-lite worker ...` without loading the server app (a
lighter start for a machine that only runs a worker)."""

from horde_lite.worker.command import worker

worker(prog_name="python -m horde_lite.worker")
