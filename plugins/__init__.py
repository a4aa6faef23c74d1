"""horde_lite's built-in policies, one module per policy, each found only through its entry point."""
