"""``python -m traceanalyze``: the same command line as the ``traceanalyze`` console script."""

from traceanalyze.cli import main

if __name__ == "__main__":
    main()
