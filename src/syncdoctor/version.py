"""The package version, in a module of its own: parts that must not import the package root
(which imports the probe) read it here."""

__version__ = "0.1.0"
