"""horde_lite: a self-hosted broker for crowd-sourced text generation."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("horde-lite")  # the installed distribution's, from pyproject.toml
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0.1.0"
