"""horde_lite: a self-hosted broker for crowd-sourced text generation."""

__version__ = "0.1.0"
