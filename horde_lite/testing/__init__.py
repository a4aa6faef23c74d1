"""Test kits horde_lite ships for the authors of policies (imported by their test suites, never by
the running server)."""
