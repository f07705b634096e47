"""Writing files without losing data: atomic replace, no silent overwrite, locked appends.

- `write_atomic(path, text, force)`: the text goes to a temporary file in the target's own
  directory (same file system), is flushed and fsync'ed, then `os.replace`d over the target, so a
  reader sees the old file or the new one, never half of either; a failed write (full disk)
  removes the temporary file and leaves the target untouched. An existing target is refused
  unless `force`.
- `append_locked(path, update, lock_timeout_s)`: read-modify-write under an exclusive `fcntl.flock`
  on `PATH.lock`, so concurrent appenders (several `zplan calibrate --out same.yaml`) each see the
  previous one's result; the write itself is `write_atomic`.

Every failure is a `PlanInputError` (refused overwrite) or an `OutputError` (the OS refused:
full disk, read-only directory, no permission): one line, and the CLI exits non-zero but never 1.
"""

from __future__ import annotations

import errno
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from planner.core.errors import PlanInputError


class OutputError(OSError):
    """The operating system refused to write (full disk, permissions, closed stdout)."""


def describe_os_error(err: OSError) -> str:
    """`ENOSPC` -> "no space left on device"; always one short line."""
    reason = err.strerror or (errno.errorcode.get(err.errno or 0, "") if err.errno else "") or str(err)
    return reason[0].lower() + reason[1:] if reason else "write failed"


def refuse_existing(path: Path, force: bool, field: str = "--output") -> None:
    """Refuse an existing target unless `force` (checked before any work is written)."""
    path = Path(path)
    if path.is_dir():
        raise PlanInputError(field, f"{path} is a directory; give a file name")
    if path.exists() and not force:
        raise PlanInputError(field, f"{path} exists; pass --force to replace it")
    if not path.parent.exists():
        raise PlanInputError(field, f"{path.parent} does not exist")


def write_atomic(path: Path, text: str, force: bool = False, field: str = "--output") -> None:
    """Write `text` (UTF-8) to `path` via a temporary file in the same directory and a rename."""
    write_bytes_atomic(path, text.encode("utf-8"), force, field)


def write_bytes_atomic(path: Path, data: bytes, force: bool = False, field: str = "--output") -> None:
    """`write_atomic` for bytes (a PNG)."""
    path = Path(path)
    refuse_existing(path, force, field)
    _replace(path, data)


def _default_mode() -> int:
    """0666 minus the process umask: the mode `open(path, "w")` would give a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _replace(path: Path, data: bytes) -> None:
    """Temporary file + fsync + os.replace; the temporary file never survives a failure."""
    directory = path.parent if str(path.parent) else Path(".")
    mode = path.stat().st_mode & 0o777 if path.exists() else _default_mode()
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    except OSError as err:
        raise OutputError(err.errno, f"cannot write {path}: {describe_os_error(err)}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)  # mkstemp makes 0600; keep the old file's mode, or the umask's
        os.replace(tmp_name, path)
    except OSError as err:
        Path(tmp_name).unlink(missing_ok=True)
        raise OutputError(err.errno, f"cannot write {path}: {describe_os_error(err)}") from None
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def append_locked(path: Path, update: Callable[[str | None], str], lock_timeout_s: float = 60.0) -> None:
    """Replace `path` by `update(old_text or None)` while holding an exclusive lock.

    The lock is `fcntl.flock` on `PATH.lock` (created if missing, left in place: removing it would
    let a waiting process lock a file nobody else sees). `update` runs under the lock, so it must
    only compute text (e.g. parse the old entries and add the new ones).
    """
    import fcntl

    path = Path(path)
    lock_path = path.with_name(path.name + ".lock")
    try:
        lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise OutputError(err.errno, f"cannot lock {path}: {describe_os_error(err)}") from None
    try:
        deadline = time.monotonic() + lock_timeout_s
        while True:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OutputError(errno.EAGAIN, f"{path} is locked by another process "
                                                    f"(waited {lock_timeout_s:.0f} s)") from None
                time.sleep(0.01)
        old = path.read_text(encoding="utf-8") if path.exists() else None
        _replace(path, update(old).encode("utf-8"))
    finally:
        os.close(lock_fd)  # closing the descriptor releases the flock
