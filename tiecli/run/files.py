"""Files written so that a crash leaves the old one or the new one, files read with one-line errors, the lock."""

import fcntl
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import yaml

from tiecli.errors import TiecliError


class FormatError(TiecliError):
    """A run-directory file that is missing, unreadable or of the wrong shape. Exit code 1."""


UMASK = os.umask(0)  # the process umask, read once (os.umask can only be read by setting it)
os.umask(UMASK)


def atomic_write(path: Path, data: str | bytes) -> None:
    tmp = staged(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def staged(path: Path, data: str | bytes) -> Path:
    """data written and synced to a temporary name beside path (.NAME.x1y2.tmp), for the caller to rename
    into place: several files staged first, then renamed, are replaced all or none on a full disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~UMASK)  # mkstemp makes 0600; give the file the usual permissions
        return Path(tmp)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # a failed write (ENOSPC, EFBIG) names no file: name it
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise


def write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=2) + "\n")


def read_json(path: Path, what: str = "") -> object:
    """Parsed JSON; FormatError naming the file when it is absent, unreadable or not JSON."""
    path = Path(path)
    what = what or repr(str(path.parent))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FormatError(f"{what}: {path.name} does not exist") from None
    except (OSError, ValueError) as e:  # ValueError: bad JSON or bad UTF-8
        raise FormatError(f"{what}: {path.name} is unreadable ({type(e).__name__})") from None


def read_yaml(path: Path, what: str) -> dict:
    try:
        obj = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FormatError(f"{what}: {Path(path).name} does not exist") from None
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise FormatError(f"{what}: {Path(path).name} is unreadable ({type(e).__name__})") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{what}: {Path(path).name} is not a mapping")
    return obj


def now() -> str:
    """The time now, as every record stores it: UTC, ISO 8601, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Lock:
    """An exclusive flock on a file: one writer per run (or sweep). The OS drops it when the process dies."""

    fd: int | None

    def __init__(self, path: Path, what: str):
        self.path, self.what, self.fd = Path(path), what, None

    def acquire(self) -> "Lock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666 & ~UMASK)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise TiecliError(f"{self.what} is in use by process {holder}; wait for it to finish or stop it") from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())  # for the message above only: liveness is the lock itself
        except OSError:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> "Lock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def is_locked(path: Path) -> bool:
    """Whether some process holds the lock file at path (a run being written right now)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def remove_temporaries(folder: Path) -> None:
    """Temporary files a killed writer left (`.last.pt.x1y2.tmp`): only ever called under the lock."""
    for tmp in Path(folder).rglob(".*.tmp"):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
