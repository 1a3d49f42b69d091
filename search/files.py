"""Files written into folders other users may share (a model cache, the data directory).

Another user of a shared folder can plant a symlink where chartcite is about to write ("the lock
file", "the choice's temporary file") and have chartcite overwrite a file of its own user with it.
So nothing here opens a name it did not just create: a file is written to a fresh temporary file
(`mkstemp` creates it with O_EXCL and O_NOFOLLOW) and renamed over the name (`os.replace` replaces
a symlink there, never its target); a lock is opened with O_NOFOLLOW and never truncated; and a
folder every user may write without the sticky bit (where anyone may rename or delete anyone's
files) is refused, naming it.
"""
from __future__ import annotations

import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path


class UnsafeFolder(OSError):
    """A folder chartcite will not write into, or a name in it that is a symlink."""


def refuse_shared_folder(folder: Path) -> None:
    """Raise UnsafeFolder for a folder any user may write in without the sticky bit."""
    mode = os.stat(folder).st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise UnsafeFolder(f"{folder} is writable by every user and not sticky, so another user could replace "
                           f"chartcite's files in it: `chmod o-w {folder}` (or `chmod +t` if it must be shared), "
                           "or use a folder of chartcite's own")


def write_file(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """`data` written whole to `path`, or not at all, through a new file in the same folder."""
    path = Path(path)
    refuse_shared_folder(path.parent)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data.encode() if isinstance(data, str) else data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(partial, mode)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def temporary_path(target: Path) -> Path:
    """A new, empty file beside `target` for a tool that writes by file name (an ONNX export), to
    be renamed over `target` with os.replace."""
    refuse_shared_folder(target.parent)
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    return Path(partial)


@contextmanager
def locked(path: Path):
    """An exclusive lock on `path` for the block: created if missing, never followed if a symlink,
    never truncated."""
    import fcntl

    refuse_shared_folder(path.parent)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafeFolder(f"{path} is a symlink; chartcite does not follow one where it keeps its lock files: "
                               "remove it") from exc
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
