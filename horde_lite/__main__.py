"""`python -m horde_lite ...` is `horde-lite ...` (the demo starts its server this way)."""

from horde_lite.cli import main

main()
