"""The tool's name and version, as every output states them (a leaf: every layer may import it)."""

TOOL = "traceanalyze"
__version__ = "0.1.0"  # as pyproject.toml [project] version
