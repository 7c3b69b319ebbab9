"""The kmq release version (the one place it is written)."""

__version__ = "0.1.0"
