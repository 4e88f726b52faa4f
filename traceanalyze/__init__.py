"""traceanalyze: explain why a distributed PyTorch training run was slow, from its profiler traces and logs."""

__version__ = "0.1.0"
