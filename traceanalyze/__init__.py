"""traceanalyze: explain why a distributed PyTorch training run was slow, from its profiler traces and logs.

Python API (loaded on first use, so ``import traceanalyze`` stays light)::

    import traceanalyze as ta
    a = ta.analyze("traces/")          # -> traceanalyze.api.Report
    a.ranks; a.findings; a.sql("SELECT ...")
"""

from traceanalyze.version import __version__

_API = ("analyze", "load", "Report")
__all__ = ["Report", "__version__", "analyze", "load"]


def __getattr__(name: str):
    if name in _API:
        from traceanalyze import api

        return getattr(api, name)
    raise AttributeError(f"module 'traceanalyze' has no attribute {name!r}")
