"""Safety rails for what traceanalyze writes and prints (README, "Safety"):

- :func:`check_own_db`: ``--db``, the parse cache and the batch catalog change only a DuckDB file that
  traceanalyze created, recognised by its marker table (:data:`MARKER_TABLE`: tool, schema version, role).
- :func:`check_outputs`: no output path is an input file (resolved paths, symlinks and hard links count), no two
  outputs share a path, and every output folder is writable; checked before any work.
- :func:`atomic_write_text` / :func:`atomic_path`: every output goes to a temporary file in its own folder and is
  renamed into place (``os.replace``), so a failure never leaves half a file.
- :func:`open_untrusted`: a database a user hands in is opened read-only, without file-system access and without
  extension autoload/autoinstall, its configuration locked.
- :func:`terminal` and :func:`md_text`: input-derived text made inert for a terminal and for CommonMark/GFM.
- :func:`redact`: credential-like keys (and ``NAME=value`` in strings) removed from what a trace header or an
  environment file holds, before anything is stored.
- :func:`env_allowed`: the allow-list of environment variables that ``capture`` records and ``logs`` reads back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from traceanalyze.errors import EnvironmentFailure, TraceanalyzeError, UsageError

TOOL = "traceanalyze"
MARKER_TABLE = "traceanalyze_marker"  # one row: (tool, schema_version, role)
ROLES = {"report": "report database", "catalog": "batch catalog"}
# DuckDB's file header: 8 bytes of checksum, then the magic bytes (duckdb storage format, "DUCK" at offset 8)
_DUCKDB_MAGIC = b"DUCK"

# Set at connect (cannot be changed later with lock_configuration): a crafted view over read_text('/etc/passwd'),
# read_csv(...), COPY ... TO, ATTACH or an extension install fails with a PermissionException.
UNTRUSTED_CONFIG = {"enable_external_access": False, "autoload_known_extensions": False,
                    "autoinstall_known_extensions": False, "lock_configuration": True}


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
# Every character that can start markup in CommonMark or GitHub/GitLab Markdown, backslash-escaped (CommonMark
# 0.31 §2.4: any ASCII punctuation may be escaped and then renders as itself):
#   [ ] !      links, images, reference definitions   (< > & become &lt; &gt; &amp;: raw HTML, autolinks)
#   ` * _ ~    code spans, emphasis, strikethrough      |  table cells        # heading; GitHub issue refs (#12)
#   :          GFM autolinks (http://...) and emoji (:smile:)   @  e-mail autolinks, @mentions   $  math
#   \          the escape itself                        + - = .  list/heading/setext markers at a line start
# A "." is escaped only after "www" (the GFM www. autolink) and at the start, so numbers stay readable.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]#!|~:@$]|(?<=[wW]{3})\.|^[-+=.])")
# < > & as character references (valid in every Markdown dialect and in HTML): the raw text holds no "<"
_MD_ENTITY = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def md_text(x: object) -> str:
    """Input-derived text for Markdown: one line, inert (no link, image, raw HTML, emphasis, mention or emoji).

    Newlines become spaces, control and bidi characters U+FFFD, blanks at either end go, and markup characters
    are backslash-escaped (:data:`_MD_SPECIAL`). The rendered text reads as the original.
    """
    # stripped: leading blanks would let a list marker or a setext underline ("-", "=") start a block
    s = _MD_CONTROL.sub("\ufffd", str(x).replace("\r", " ").replace("\n", " ")).strip()
    s = re.sub("[&<>]", lambda m: _MD_ENTITY[m.group(0)], s)
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return re.sub(r"^(\d{1,9})([.)])", r"\1\\\2", s)  # "1." or "1)" would start an ordered list


# ---- secrets ------------------------------------------------------------------------------------------------------

# A name that looks like a credential (README, Safety: no secrets in reports): HF_TOKEN, AWS_SECRET_ACCESS_KEY,
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


# The environment variables kept from a process (README, Safety): the ones that change communication, recorded by
# capture.environment and read back from env_rank{r}.json by logs.parse_env; nothing else is stored or printed.
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_", "UCX_", "FI_")
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
             "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "OMP_NUM_THREADS", "TORCHELASTIC_RUN_ID",
             "PYTORCH_CUDA_ALLOC_CONF", "CUDA_DEVICE_MAX_CONNECTIONS", "TORCHINDUCTOR_CACHE_DIR")


def env_allowed(name: str) -> bool:
    """Whether an environment variable is one :func:`traceanalyze.capture.environment` records
    (:data:`ENV_PREFIXES`, :data:`ENV_NAMES`) and not named like a credential (``*KEY*``, ``*TOKEN*``, ``*SECRET*``,
    ``*PASSWORD*``, ``*CREDENTIAL*``): the allow-list the analyzer also applies to ``env_rank{r}.json`` (README,
    Safety)."""
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


# ---- databases ----------------------------------------------------------------------------------------------------

def _is_duckdb_file(path: Path) -> bool:
    with open(path, "rb") as fh:
        head = fh.read(12)
    return len(head) == 12 and head[8:12] == _DUCKDB_MAGIC


def open_untrusted(path: str | Path, busy: str = ""):
    """Open a DuckDB database a user hands in: read-only, no file-system access, no extension autoload/install,
    configuration locked (:data:`UNTRUSTED_CONFIG`). ``busy`` ends the message when another process holds it.

    Raises:
        TraceanalyzeError: the file cannot be opened (not a DuckDB database, in use, unreadable).
    """
    import duckdb

    try:
        return duckdb.connect(str(path), read_only=True, config=dict(UNTRUSTED_CONFIG))
    except duckdb.Error as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "lock" in first.lower():
            raise TraceanalyzeError(f"{path}: the database is in use by another traceanalyze run; wait for it to "
                                    f"finish{busy}") from None
        raise TraceanalyzeError(f"{path}: cannot open the database ({first})") from None


def untrusted_error(path: str | Path, exc: Exception) -> TraceanalyzeError:
    """The one-line error for a query on an untrusted database that failed (a refused file access named)."""
    import duckdb

    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, duckdb.PermissionException):
        return TraceanalyzeError(f"{path}: refused: the database tries to read or write files outside itself "
                                 f"({first}); databases handed to traceanalyze are opened without file access")
    return TraceanalyzeError(f"query failed: {first}")


def _tables(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                                      "UNION ALL SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' "
                                      "AND NOT internal").fetchall()}


# The tables an unmarked database written before the marker existed holds: such a file is adopted (migrated).
_LEGACY = {"report": ({"meta", "files", "kernels", "cpu_ops", "runs", "report_cache"}, "schema_version"),
           "catalog": ({"meta", "runs", "findings", "rank_metrics", "batches"}, "catalog_version")}


def db_marker(path: str | Path) -> tuple[str, int, str] | str | None:
    """What the database at ``path`` is: ``(tool, schema_version, role)`` from its marker; ``"legacy-report"`` or
    ``"legacy-catalog"`` for a database of an earlier traceanalyze (its tables and its ``meta`` version key, no
    marker); None for any other DuckDB database. Reads only (opened as :func:`open_untrusted`)."""
    import duckdb

    try:
        con = open_untrusted(path, busy=" or pass a different --db")
    except TraceanalyzeError as exc:
        if "different configuration" not in str(exc):
            raise
        # this process holds it open already (a Python session that ran analyze on it): share that instance
        con = duckdb.connect(str(path))
    try:
        tables = _tables(con)
        if MARKER_TABLE in tables:
            row = con.execute(f"SELECT tool, schema_version, role FROM {MARKER_TABLE} LIMIT 1").fetchone()
            if row is not None and row[0] == TOOL:
                return str(row[0]), int(row[1]), str(row[2])
            return None
        for role, (need, key) in _LEGACY.items():
            if need <= tables:
                if con.execute("SELECT count(*) FROM meta WHERE key = ?", [key]).fetchone()[0]:
                    return f"legacy-{role}"
        return None
    except Exception:  # a view that reads files, a table of another shape: not ours
        return None
    finally:
        con.close()


def check_own_db(path: str | Path | None, role: str) -> str:
    """Refuse, before anything is written, a database path that exists and is not traceanalyze's own of ``role``.

    Returns ``"new"`` (no file yet), ``"own"`` (marked, this role) or ``"legacy"`` (an unmarked database written
    by an earlier traceanalyze with this role's tables: the caller adds the marker, a migration).

    Raises:
        UsageError: the path is a folder, not a DuckDB file, a DuckDB database traceanalyze did not create, or
            one of the other role (a batch catalog passed as ``--db``, a report database as a catalog). The
            file is not opened for writing, so it stays byte-identical.
        TraceanalyzeError: the file is in use or unreadable.
    """
    if path is None or str(path) == ":memory:":
        return "new"
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return "new"
    what = ROLES[role]
    if not p.is_file():
        raise UsageError(f"{p}: not a file; the {what} must be a DuckDB file that traceanalyze creates")
    try:
        duck = _is_duckdb_file(p)
    except OSError as exc:
        raise TraceanalyzeError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if not duck:
        raise UsageError(f"{p}: exists and is not a DuckDB database; traceanalyze writes only databases it "
                         f"created, so it is left untouched: pass another path for the {what}")
    mark = db_marker(p)
    if isinstance(mark, tuple):
        if mark[2] == role:
            return "own"
        raise UsageError(f"{p}: is a traceanalyze {ROLES.get(mark[2], mark[2])}, not a {what}; it is left "
                         f"untouched: pass another path")
    if mark == f"legacy-{role}":
        return "legacy"
    if isinstance(mark, str):  # legacy database of the other role
        other = mark.removeprefix("legacy-")
        raise UsageError(f"{p}: is a traceanalyze {ROLES[other]}, not a {what}; it is left untouched: "
                         "pass another path")
    raise UsageError(f"{p}: is a DuckDB database that traceanalyze did not create (no {MARKER_TABLE} table); "
                     f"it is left untouched: pass another path for the {what}")


def write_marker(con, schema_version: int, role: str) -> None:
    """Create or refresh the marker table of a database traceanalyze writes."""
    con.execute(f"CREATE TABLE IF NOT EXISTS {MARKER_TABLE} (tool VARCHAR, schema_version INTEGER, role VARCHAR)")
    row = con.execute(f"SELECT tool, schema_version, role FROM {MARKER_TABLE}").fetchall()
    if row != [(TOOL, schema_version, role)]:
        con.execute(f"DELETE FROM {MARKER_TABLE}")
        con.execute(f"INSERT INTO {MARKER_TABLE} VALUES (?, ?, ?)", [TOOL, schema_version, role])


# ---- output paths ---------------------------------------------------------------------------------------------------

def _key(p: Path) -> str:
    return os.path.normcase(os.path.realpath(p))  # realpath does not raise on a symlink loop


def is_own_output(path: str | Path) -> bool:
    """Whether an existing file is one traceanalyze wrote: an HTML report or batch index (its generator meta), a
    JSON report (``"tool": {"name": "traceanalyze"``), a Markdown summary (``## traceanalyze:``), a merged trace
    (``{"traceanalyze_export"``, gzip or not), or a DuckDB database with the marker (or an earlier one's tables)."""
    import gzip

    p = Path(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(4096)
        if head[:2] == b"\x1f\x8b":
            with gzip.open(p, "rb") as fh:
                head = fh.read(4096)
        if len(head) >= 12 and head[8:12] == _DUCKDB_MAGIC:
            return db_marker(p) is not None
    except (OSError, EOFError, TraceanalyzeError):
        return False
    return (b'<meta name="generator" content="traceanalyze' in head or head.startswith(b"## traceanalyze:")
            or head.startswith(b'{"traceanalyze_export"')
            or (head.startswith(b"{") and b'"tool": {' in head[:64] and b'"name": "traceanalyze"' in head[:100]))


def check_outputs(outputs: Iterable[tuple[str, str | Path]], inputs: Iterable[str | Path],
                  input_dirs: Iterable[str | Path] = ()) -> None:
    """Refuse, before any work, outputs that are inputs or that share a path, and outputs in unwritable folders.

    Args:
        outputs: (option name, path) of every file the command will write (``-o``, ``--json``, ``--db``, ...).
        inputs: every file the command reads (traces, logs, sidecars, files looked at and skipped).
        input_dirs: the folders given as inputs: an existing file inside one of them is an input unless
            traceanalyze wrote it (:func:`is_own_output`), whether the analysis reads it or not.

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
        if hit is None and os.path.lexists(p) and not is_own_output(p):
            hit = next((Path(d) for d in dirs if os.path.commonpath([d, real]) == d), None)
            if hit is None:
                hit = _hard_link_in(p, dirs)
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
