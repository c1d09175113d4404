"""The package version, in one place (the root package and every file attnlab writes read it)."""

__version__ = "0.1.0"
