"""Safe file I/O for every file kvbench reads or writes: one-line errors, never a traceback.

Writes: output locations are checked before any work (`check_output_file`, `check_output_dir`:
not a directory / a file, writable, free space), whole files are written through a temporary
file with a unique name in the same directory and renamed over the target (`write_atomic`), so a
reader sees the old file or the new one, never half of one, and two writers of the same file
never share a temporary file. New files get the mode the umask gives (0666 & ~umask), as any
other program's files, not mkstemp's 0600. Appends (`append_bytes`) are one write of whole lines;
a write that fails (disk full) is cut back to the file's previous length.

Reads: text files are read up to a size cap (a suite named /dev/zero must not fill memory), as
strict UTF-8 (a UTF-16 or binary file is named as such). This module imports neither mlx nor
kernels/.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from pathlib import Path

from kvbench.errors import UserError

MAX_TEXT_BYTES = 16 * 2**20  # suites and JSON inputs: far above any real one


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def file_mode() -> int:
    """The mode a new file gets from the process umask (0666 & ~umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _user_error(path, key: str, reason: str) -> UserError:
    return UserError(f"{path}: {reason}" if key == "-" else f"{path}: {key}: {reason}")


NOT_REGULAR = {
    stat.S_ISDIR: "a directory",
    stat.S_ISFIFO: "a named pipe",
    stat.S_ISCHR: "a device",
    stat.S_ISBLK: "a device",
    stat.S_ISSOCK: "a socket",
}


def not_regular(path: str | Path) -> str | None:
    """Why path is not a regular file to read (no such file, a directory, a named pipe, a
    device: reading one would block or never end), or None."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"cannot read: {_why(e)}"
    if stat.S_ISREG(mode):
        return None
    return next((k for test, k in NOT_REGULAR.items() if test(mode)), "not a regular file")


def read_text(
    path: str | Path, key: str = "-", limit_bytes: int = MAX_TEXT_BYTES, error=_user_error
) -> str:
    """The text of a UTF-8 file of at most limit_bytes; error(path, key, reason) otherwise (a
    UserError by default; the suite loader passes SuiteError). A named pipe or a device is
    refused before it is opened (opening a pipe blocks until a writer comes)."""
    why = not_regular(path)
    if why is not None and not why.startswith("cannot"):
        raise error(path, key, f"{why}, not a file kvbench reads")
    try:
        with open(path, "rb") as f:
            data = f.read(limit_bytes + 1)
    except OSError as e:
        raise error(path, key, f"cannot read: {_why(e)}") from None
    if len(data) > limit_bytes:
        raise error(path, key, f"larger than {limit_bytes} bytes; not a kvbench input")
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise error(path, key, "UTF-16 text; save the file as UTF-8")
    if b"\x00" in data:
        raise error(path, key, "a binary file (NUL bytes), not text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        reason = f"not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})"
        raise error(path, key, reason) from None


def check_output_file(path: str | Path) -> Path:
    """An output file's path, checked before any work: not a directory, its folder exists (or
    can be made) and is writable."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: -o: is a directory; give a file name")
    why = not_regular(path) if path.exists() else None
    if why is not None:  # a named pipe would block the write until a reader comes
        raise UserError(f"{path}: -o: {why}, not a file to write")
    check_output_dir(path.parent if str(path.parent) else Path("."), 0, key="-o")
    return path


def check_output_dir(path: str | Path, need_bytes: int, key: str = "--out") -> Path:
    """An output directory, made if missing, checked writable with need_bytes free."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{path}: {key}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{path}: {key}: cannot create the directory: {_why(e)}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{path}: {key}: not writable")
    free = shutil.disk_usage(path).free
    if free < need_bytes:
        raise UserError(
            f"{path}: {key}: {free} bytes free, the results need up to {need_bytes} bytes"
        )
    return path


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Write a whole file via a uniquely named temporary file in its directory and a rename; a
    failure (disk full, read-only) leaves no temporary file and raises a one-line UserError."""
    path = Path(path)
    blob = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies
        try:
            _write_all(fd, blob)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"{path}: cannot write: {_why(e)}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _write_all(fd: int, blob: bytes) -> None:
    view = memoryview(blob)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def create_exclusive(path: str | Path, data: bytes) -> bool:
    """Create path holding data, only if it does not exist yet (False then): how a run claims
    its file names in a directory other runs may share."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return False
    except OSError as e:
        raise UserError(f"{path}: cannot create: {_why(e)}") from None
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except OSError as e:
        os.close(fd)
        Path(path).unlink(missing_ok=True)
        raise UserError(f"{path}: cannot write: {_why(e)}") from None
    os.close(fd)
    return True


def append_bytes(path: str | Path, data: bytes) -> None:
    """Append whole lines with one write and an fsync; on failure (disk full) the file is cut
    back to its previous length, so it never ends in half a line."""
    if not data:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError as e:
        raise UserError(f"{path}: cannot write: {_why(e)}") from None
    size = os.fstat(fd).st_size
    try:
        _write_all(fd, data)
        os.fsync(fd)
    except OSError as e:
        os.ftruncate(fd, size)
        raise UserError(f"{path}: cannot write: {_why(e)}") from None
    except BaseException:
        os.ftruncate(fd, size)  # a third signal mid-write: no half line
        raise
    finally:
        os.close(fd)
