"""The HTML pages: one Jinja2 environment over ``traceanalyze/report/templates`` (autoescape on, the display
filters of :mod:`traceanalyze.fmt`), made on first use, whose compiled templates are kept on disk.

Compiling the report templates (lexing, parsing and generating Python, then ``compile``) costs more CPU than
rendering them, on every process start (about 0.1 s; loading them from the cache takes about 2 ms). Jinja2's
bytecode cache keeps the compiled code in a per-user cache folder, ``$XDG_CACHE_HOME/traceanalyze/jinja-<Jinja2
version>`` (``~/.cache/...`` when XDG_CACHE_HOME is unset or relative), made on demand. An entry is used only when
its checksum matches the template source, so an edited template is compiled again; the key also covers the
environment options below and the template's path, and Jinja2 rejects entries written by another Python version.
The entries are code that is run, so a folder that is not ours or that others can write to is not used. When the
folder cannot be made, read or written (read-only home, permissions, a full disk, a corrupt entry), templates are
compiled as before: the cache never makes a report fail.
"""

from __future__ import annotations

import os
import re
import stat
from typing import TYPE_CHECKING, Any

from traceanalyze.fmt import (
    basename,
    fmt_bytes,
    fmt_float,
    fmt_gbps,
    fmt_int,
    fmt_ms,
    fmt_pct,
    fmt_signed_ms,
    ranges,
    short_kernel_name,
    short_name,
    text,
    where,
)
from traceanalyze.report.model import report_view

if TYPE_CHECKING:  # imported where used: the Markdown summary and the JSON output need no Jinja2
    import jinja2

_FILTERS = {"ms": fmt_ms, "signed_ms": fmt_signed_ms, "pct": fmt_pct, "int": fmt_int, "num": fmt_float,
            "bytes": fmt_bytes, "gbps": fmt_gbps, "text": text, "basename": basename, "where": where,
            "short": short_name, "kshort": short_kernel_name, "ranges": ranges}
_ENV_OPTIONS = {"trim_blocks": True, "lstrip_blocks": True}  # they change the compiled code: part of the cache key
_AUTOESCAPE = {"default": True, "default_for_string": True}
_env_made: jinja2.Environment | None = None

# C0/C1 control characters but tab, newline and carriage return: trace names can hold them (a NUL, an ANSI escape);
# in HTML they are parse errors, so they become U+FFFD (what a browser would show for a NUL) in both outputs.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _template_cache_dir() -> str | None:
    """The folder for compiled templates, or None when there is no home to put it in or no Jinja2 version."""
    import jinja2

    version = vars(jinja2).get("__version__")  # vars(): never a deprecation warning, should Jinja2 add one
    if not version:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("jinja2")
        except Exception:  # no metadata: without a version, compiled code could outlive a Jinja2 upgrade
            return None
    base = os.environ.get("XDG_CACHE_HOME") or ""
    if not os.path.isabs(base):  # the XDG spec: a relative path is ignored
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "traceanalyze", f"jinja-{version}")


def _bytecode_cache(directory: str) -> jinja2.BytecodeCache:
    from jinja2 import FileSystemBytecodeCache

    salt = repr((sorted(_ENV_OPTIONS.items()), sorted(_AUTOESCAPE.items())))

    class _SafeBytecodeCache(FileSystemBytecodeCache):
        """:class:`jinja2.FileSystemBytecodeCache` that makes its folder on the first write and never raises:
        an entry that cannot be read is compiled again, one that cannot be written is not kept."""

        def get_cache_key(self, name: str, filename: str | None = None) -> str:
            return super().get_cache_key(f"{name}|{salt}", filename)

        def _private(self) -> bool:
            """The folder is ours and only we can write to it: entries are code that gets run, so a folder others
            could write to (XDG_CACHE_HOME pointed at /tmp) is not used, as Jinja2's own default folder is not."""
            st = os.stat(self.directory)
            mine = not hasattr(os, "getuid") or st.st_uid == os.getuid()
            return mine and stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o022

        def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            try:
                if self._private():
                    super().load_bytecode(bucket)
            except Exception:  # no folder yet, the path names a file, a truncated entry: compile instead
                bucket.reset()

        def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
            try:
                os.makedirs(self.directory, mode=0o700, exist_ok=True)
                if self._private():
                    super().dump_bytecode(bucket)
            except Exception:  # read-only home, permissions, full disk: compiled again next time
                pass

    return _SafeBytecodeCache(directory, "%s.cache")


def _new_env() -> jinja2.Environment:
    """A Jinja2 environment for the templates in ``traceanalyze/report/templates`` (autoescape on, custom filters),
    with the bytecode cache described above (its folder is read from the environment variables now)."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    directory = _template_cache_dir()
    env = Environment(loader=PackageLoader("traceanalyze.report", "templates"),
                      autoescape=select_autoescape(**_AUTOESCAPE),
                      bytecode_cache=_bytecode_cache(directory) if directory else None, **_ENV_OPTIONS)
    env.filters.update(_FILTERS)
    return env


def environment() -> jinja2.Environment:
    """The process's Jinja2 environment for the report templates, made on first use."""
    global _env_made
    if _env_made is None:
        _env_made = _new_env()
    return _env_made


def render_template(name: str, **context: Any) -> str:
    """The template ``name`` of ``traceanalyze/report/templates`` rendered with ``context``."""
    return environment().get_template(name).render(**context)


def render_html(model: dict) -> str:
    """The HTML report: one file, inline CSS and SVG, no scripts or network requests.

    Args:
        model: the report model from :func:`traceanalyze.pipeline.analyze` (``Analysis.model``); optional keys
            (``verdict``, ``findings``, ``comparison``, ``dtype_mix``, ``collectives``, ...) are shown when present.

    Returns:
        The complete HTML document as text.
    """
    return _CONTROL.sub("\ufffd", render_template("report.html.j2", v=report_view(model)))
