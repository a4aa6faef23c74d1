"""Policy protocols and their registry. Built-in policies live in the repository's `plugins/`
folder, installed as the package `horde_lite_policies`, and are found, like third-party ones, only
through entry points."""
