"""Safety rails for what traceanalyze writes and prints (docs/safety.md):

- :func:`check_outputs`: no output path is an input file (resolved paths, symlinks and hard links count), no two
  outputs share a path, and every output folder is writable; checked before any work.
- :func:`atomic_write_text` / :func:`atomic_path`: every output goes to a temporary file in its own folder and is
  renamed into place (``os.replace``), so a failure never leaves half a file.
- :func:`terminal` and :func:`md_text`: input-derived text made inert for a terminal and for CommonMark/GFM.
- :func:`redact`: credential-like keys (and ``NAME=value`` in strings) removed from what a trace header or an
  environment file holds, before anything is stored.
- :func:`env_allowed`: the allow-list of environment variables that ``capture`` records and ``logs`` reads back.

Our DuckDB files (the marker that ``--db``, the parse cache and the batch catalog check, and databases handed in
by users, opened untrusted) are :mod:`traceanalyze.store`'s: this module imports nothing of the project but its
errors, so the output checks take store's test for our own databases as an argument.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from traceanalyze.errors import EnvironmentFailure, TraceanalyzeError, UsageError

# DuckDB's file header: 8 bytes of checksum, then the magic bytes (duckdb storage format, "DUCK" at offset 8)
_DUCKDB_MAGIC = b"DUCK"


# ---- terminal and Markdown text ---------------------------------------------------------------------------------

# C0/C1 controls (ANSI escapes, NUL, newlines) and the Unicode bidi controls and marks that reorder what a
# terminal shows (Trojan Source, CVE-2021-42574): U+061C, U+200E/F, U+202A-202E, U+2066-2069.
_TERMINAL_BAD = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal(msg: str) -> str:
    """One terminal line: control characters and bidi controls (from file, kernel or run names) shown as ``?``."""
    return _TERMINAL_BAD.sub("?", msg)


def terminal_block(text: str) -> str:
    """Like :func:`terminal` for multi-line output (a table): newlines and tabs stay, everything else as there."""
    return re.sub("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]", "?", text)


_MD_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
# What CommonMark and GitHub/GitLab Markdown need escaped in inline text, and no more: a ticket pasted into Jira or
# Slack shows every backslash, so "found: no finding" and "0.1.0" stay as they are. Backslash-escaped (CommonMark
# 0.31 §2.4: escaped ASCII punctuation renders as itself):
#   \ ` * [ ] ~ $     always: escapes, code spans, emphasis, links and images, strikethrough, math
#   <                 always, as "&lt;" (raw HTML, autolinks): no "<" in the text even for a renderer that
#                     ignores backslash escapes
#   _                 unless between two letters or digits (intraword "_" opens no emphasis: kernel_names_stay)
#   |                 in a table cell (cell=True)
#   &                 before an entity ("&amp;", "&#60;"); a lone "&" is text
#   :  .  @  #        only where GitHub would link: "scheme://", "www.", "@name" or "a@b" (mentions, e-mail),
#                     "#12" (issue references)
#   # - + = > 1. 1)   at a line's start (line_start=True): headings, lists, setext underlines, block quotes
_MD_ALWAYS = frozenset("\\`*[]~$")
_MD_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{0,31});")
_MD_LINE_START = re.compile(r"^(?:([#+=>-])|(\d{1,9})([.)]))")


def _md_escaped(s: str, i: int, cell: bool) -> bool:
    """Whether ``s[i]`` needs a backslash in inline Markdown (:data:`_MD_ALWAYS` and the rules above it)."""
    c = s[i]
    prev, nxt = s[i - 1] if i else "", s[i + 1] if i + 1 < len(s) else ""
    if c in _MD_ALWAYS or (c == "|" and cell):
        return True
    if c == "_":
        return not (prev.isalnum() and nxt.isalnum())
    if c == "&":
        return _MD_ENTITY.match(s, i) is not None
    if c == ":":
        return prev.isalpha() and s.startswith("//", i + 1)
    if c == ".":
        return s[max(0, i - 3):i].lower() == "www"
    if c == "@":
        return nxt.isalnum() or not nxt  # at the end: the text after the value may go on with a name
    return c == "#" and nxt.isdigit()


def md_text(x: object, *, cell: bool = False, line_start: bool = False) -> str:
    """Input-derived text for Markdown: one line, inert (no link, image, raw HTML, code, emphasis, mention, table
    break), and the rendered text reads as the original with no stray backslash.

    Newlines become spaces, control and bidi characters U+FFFD, blanks at either end go, and only what Markdown
    needs in that position is backslash-escaped (the rules above :data:`_MD_ALWAYS`): ``cell`` for a value inside
    a table cell (``|``), ``line_start`` for a value that starts a line (``#``, ``-``, ``1.``, ...).
    """
    # stripped: leading blanks would let a list marker or a setext underline ("-", "=") start a block
    s = _MD_CONTROL.sub("\ufffd", str(x).replace("\r", " ").replace("\n", " ")).strip()
    out = "".join("&lt;" if c == "<" else "\\" + c if _md_escaped(s, i, cell) else c for i, c in enumerate(s))
    if line_start:
        out = _MD_LINE_START.sub(lambda m: "\\" + m.group(1) if m.group(1) else m.group(2) + "\\" + m.group(3),
                                 out)
    return out


# ---- secrets ------------------------------------------------------------------------------------------------------

# A name that looks like a credential (docs/safety.md: no secrets in reports): HF_TOKEN, AWS_SECRET_ACCESS_KEY,
# WANDB_API_KEY, DB_PASSWORD, GOOGLE_APPLICATION_CREDENTIALS, ... Case-insensitive, anywhere in the name.
_CREDENTIAL = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
# NAME=value inside a string (a command line or an env dump copied into a header), NAME credential-like
_CREDENTIAL_ASSIGN = re.compile(r"\b([A-Za-z0-9_.-]*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)[A-Za-z0-9_.-]*)"
                                r"(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|\S+)", re.IGNORECASE)
REDACTED = "[redacted]"


def is_credential_name(name: object) -> bool:
    """Whether a variable or key name looks like a credential (``*KEY*``, ``*TOKEN*``, ``*SECRET*``,
    ``*PASSWORD*``/``*PASSWD*``, ``*CREDENTIAL*``, any case)."""
    return isinstance(name, str) and _CREDENTIAL.search(name) is not None


# The environment variables kept from a process (docs/safety.md): the ones that change communication, recorded by
# capture.environment and read back from env_rank{r}.json by logs.parse_env; nothing else is stored or printed.
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_", "UCX_", "FI_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
             "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "OMP_NUM_THREADS", "TORCHELASTIC_RUN_ID",
             "PYTORCH_CUDA_ALLOC_CONF", "CUDA_DEVICE_MAX_CONNECTIONS", "TORCHINDUCTOR_CACHE_DIR")


def env_allowed(name: str) -> bool:
    """Whether an environment variable is one :func:`traceanalyze.capture.environment` records
    (:data:`ENV_PREFIXES`, :data:`ENV_NAMES`) and not named like a credential (``*KEY*``, ``*TOKEN*``, ``*SECRET*``,
    ``*PASSWORD*``, ``*CREDENTIAL*``): the allow-list the analyzer also applies to ``env_rank{r}.json``
    (docs/safety.md)."""
    return isinstance(name, str) and (name.startswith(ENV_PREFIXES) or name in ENV_NAMES) and not \
        is_credential_name(name)


def redact_text(text: str) -> str:
    """``text`` with the value of every credential-like ``NAME=value`` (or ``NAME: value``) replaced by
    :data:`REDACTED`."""
    return _CREDENTIAL_ASSIGN.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text) if _CREDENTIAL.search(
        text) else text


def redact(obj: object) -> object:
    """A copy of a decoded JSON value with secrets removed, at any depth: the value of every credential-like key
    (:func:`is_credential_name`) becomes :data:`REDACTED`, and credential-like ``NAME=value`` inside strings too.

    Iterative (an explicit stack), so a deeply nested header cannot exhaust Python's recursion limit.
    """
    def fix(v: object) -> object:
        if isinstance(v, dict):
            return {}
        if isinstance(v, list):
            return []
        return redact_text(v) if isinstance(v, str) else v

    root = fix(obj)
    stack = [(obj, root)] if isinstance(obj, (dict, list)) else []
    while stack:
        src, dst = stack.pop()
        items = src.items() if isinstance(src, dict) else enumerate(src)
        for k, v in items:
            if isinstance(src, dict) and is_credential_name(k):
                dst[k] = REDACTED
                continue
            new = fix(v)
            if isinstance(dst, dict):
                dst[k] = new
            else:
                dst.append(new)
            if isinstance(v, (dict, list)):
                stack.append((v, new))
    return root


# ---- output paths ---------------------------------------------------------------------------------------------------

def _key(p: Path) -> str:
    return os.path.normcase(os.path.realpath(p))  # realpath does not raise on a symlink loop


def is_own_output(path: str | Path, is_own_db: Callable[[Path], bool] | None = None) -> bool:
    """Whether an existing file is one traceanalyze wrote: an HTML report or batch index (its generator meta), a
    JSON report (``"tool": {"name": "traceanalyze"``), a Markdown summary (``## traceanalyze:``), a merged trace
    (``{"traceanalyze_export"``, gzip or not), or a DuckDB database that ``is_own_db`` recognises
    (:func:`traceanalyze.store.is_own_db`: the marker, or an earlier one's tables; without it, no database is)."""
    import gzip

    p = Path(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(4096)
        if head[:2] == b"\x1f\x8b":
            with gzip.open(p, "rb") as fh:
                head = fh.read(4096)
        if len(head) >= 12 and head[8:12] == _DUCKDB_MAGIC:
            return is_own_db is not None and is_own_db(p)
    except (OSError, EOFError, TraceanalyzeError):
        return False
    return (b'<meta name="generator" content="traceanalyze' in head or head.startswith(b"## traceanalyze:")
            or head.startswith(b'{"traceanalyze_export"')
            or (head.startswith(b"{") and b'"tool": {' in head[:64] and b'"name": "traceanalyze"' in head[:100]))


def check_outputs(outputs: Iterable[tuple[str, str | Path]], inputs: Iterable[str | Path],
                  input_dirs: Iterable[str | Path] = (), is_own_db: Callable[[Path], bool] | None = None) -> None:
    """Refuse, before any work, outputs that are inputs or that share a path, and outputs in unwritable folders.

    Args:
        outputs: (option name, path) of every file the command will write (``-o``, ``--json``, ``--db``, ...).
        inputs: every file the command reads (traces, logs, sidecars, files looked at and skipped).
        input_dirs: the folders given as inputs: an existing file inside one of them is an input unless
            traceanalyze wrote it (:func:`is_own_output`), whether the analysis reads it or not.
        is_own_db: recognises the DuckDB databases traceanalyze wrote (:func:`traceanalyze.store.is_own_db`), for
            :func:`is_own_output`; without it, a database inside an input folder counts as an input.

    Raises:
        UsageError: an output is an input (same resolved path, or the same file through a hard link:
            ``os.path.samefile``; or an existing file inside an input folder that traceanalyze did not write),
            or two outputs share a path.
        EnvironmentFailure: an output's folder exists and cannot be written (read-only or no permission).
    """
    outs = [(name, Path(p)) for name, p in outputs if p is not None]
    in_keys: dict[str, Path] = {}
    in_inodes: dict[tuple[int, int], Path] = {}
    for p in inputs:
        p = Path(p)
        with contextlib.suppress(OSError):
            in_keys[_key(p)] = p
            st = p.stat()
            in_inodes[(st.st_dev, st.st_ino)] = p
    dirs = [os.path.realpath(d) for d in input_dirs]
    seen: dict[str, tuple[str, Path]] = {}
    for name, p in outs:
        k = _key(p)
        hit = in_keys.get(k)
        real = os.path.realpath(p)
        if hit is None and os.path.lexists(p):
            # an existing file inside an input folder (or a hard link into one) is an input unless we wrote it;
            # whether we did is asked only then (for a database it means opening it)
            inside = next((Path(d) for d in dirs if os.path.commonpath([d, real]) == d), None) or \
                _hard_link_in(p, dirs)
            if inside is not None and not is_own_output(p, is_own_db):
                hit = inside
        if hit is None:
            with contextlib.suppress(OSError):
                st = p.stat()
                hit = in_inodes.get((st.st_dev, st.st_ino))
        if hit is not None:
            raise UsageError(f"{name} {p}: is an input ({hit}); traceanalyze never writes over its inputs: "
                             "choose another output path")
        if k in seen:
            raise UsageError(f"{name} {p}: is also the path of {seen[k][0]}; give each output its own path")
        for other_name, q in seen.values():
            with contextlib.suppress(OSError):
                if os.path.samefile(p, q):
                    raise UsageError(f"{name} {p}: is the same file as {other_name} {q}; give each output its "
                                     "own path")
        seen[k] = (name, p)
    for name, p in outs:
        folder = Path(os.path.realpath(p)).parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent  # the folder to be created: its first existing ancestor must be writable
        if not os.access(folder, os.W_OK | os.X_OK):
            raise EnvironmentFailure(
                f"cannot write {name} {p}: the folder {folder} is read-only or not yours; choose a folder you "
                "can write to", stage="checking the output paths", code=errno.EACCES)


def _hard_link_in(p: Path, dirs: list[str]) -> Path | None:
    """A file under ``dirs`` that is the same file as ``p`` through a hard link (only looked for when ``p`` has
    more than one link)."""
    try:
        st = p.stat()
    except OSError:
        return None
    if st.st_nlink < 2:
        return None
    for d in dirs:
        for root, _, names in os.walk(d):
            for n in names:
                f = os.path.join(root, n)
                with contextlib.suppress(OSError):
                    s = os.lstat(f)
                    if (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):
                        return Path(f)
    return None


# ---- atomic writes --------------------------------------------------------------------------------------------------

_UMASK: int | None = None


def _file_mode() -> int:
    global _UMASK
    if _UMASK is None:
        _UMASK = os.umask(0o022)
        os.umask(_UMASK)
    return 0o666 & ~_UMASK


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in ``path``'s folder; on success it is renamed to ``path`` (``os.replace``), on any
    error it is deleted, so ``path`` holds either its old content or the complete new file, never half of it.
    Parent folders are created. Raises what writing raises (OSError: ENOSPC, EACCES, EROFS, ...)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:80]}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        os.chmod(tmp, _file_mode())  # mkstemp makes 0600; the report gets the mode an ordinary write would give
        yield Path(tmp)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_path`; return ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)
