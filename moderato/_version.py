"""The package version: its one home (pyproject.toml reads it from here at build time)."""

__version__ = "0.5.0"
