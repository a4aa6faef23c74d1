"""horde_lite's built-in policies, one module per policy, each found only through its entry point.

Installed as `horde_lite_policies` (pyproject.toml maps this folder to that name)."""
