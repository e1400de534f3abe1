"""The one way oom-lsp writes files in a project: `.oom_lsp/` (reports, explanations,
what-if tables, the guard's OOM report), `.oom_lsp_cache/`, the fix log, the budget
baseline and the sources `--fix` and `fix --ai` edit.

A cloned repository can commit symbolic links wherever oom-lsp writes: the folders
(`.oom_lsp/profile -> ~/.ssh`), the files (`report.json -> ~/.bashrc`) and the temporary
files' names (`report.json.tmp -> ../../victim`). So:

- a path inside the project (`root`) must resolve inside it: no folder or file on the way
  may be a link that leads out (`LinkOutOfProject`, an OSError naming the link);
- folders are created one at a time, each checked;
- a file is written to a fresh temporary file of an unpredictable name, created
  exclusively (O_CREAT | O_EXCL | O_NOFOLLOW: never through anything already there), then
  renamed over its name: a link at that name is replaced, not written through;
- `write_through` (a source file edited in place) writes the file a link inside the project
  leads to, keeping the link and the file's permissions.

A path outside `root` is one the user chose (`--out /tmp/run`): it is written as given,
still through an exclusive temporary file. Standard library only: the runtime guard uses
it inside the user's training process.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

DEFAULT_MODE = 0o644
RESULTS_FOLDER = ".oom_lsp"


class LinkOutOfProject(OSError):
    """A write that would go through a symbolic link out of the project."""

    def __init__(self, path: Path, root: Path) -> None:
        self.path = path
        self.root = root
        target = os.path.realpath(path)
        super().__init__(
            f"not written: {path} leads to {target}, outside the project {root} (a symbolic link)"
        )


def _real(path: Path | str) -> str:
    return os.path.realpath(path)


def is_inside(path: Path | str, root: Path | str) -> bool:
    """Whether `path` (lexically) is `root` or below it."""
    path, root = os.path.abspath(path), os.path.abspath(root)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolves_inside(path: Path | str, root: Path | str) -> bool:
    """Whether `path`, every link followed, is `root` (every link followed) or below it."""
    return is_inside(_real(path), _real(root))


def results_root(path: Path) -> Path | None:
    """The project of a path in an oom-lsp results folder: the folder that holds its
    (innermost) `.oom_lsp`; None for a path outside one."""
    parts = Path(os.path.abspath(path)).parts
    if RESULTS_FOLDER not in parts:
        return None
    index = len(parts) - 1 - parts[::-1].index(RESULTS_FOLDER)
    return Path(*parts[:index])


def check_path(path: Path, root: Path | None) -> None:
    """Raise LinkOutOfProject when `path` is inside `root` but resolves outside it."""
    if root is not None and is_inside(path, root) and not resolves_inside(path, root):
        raise LinkOutOfProject(Path(path), Path(root))


def make_folder(folder: Path, root: Path | None) -> list[Path]:
    """`mkdir -p folder`, one folder at a time, none through a link out of `root`. The
    folders created, outermost first (for a caller that removes them again)."""
    folder = Path(os.path.abspath(folder))
    check_path(folder, root)
    missing: list[Path] = []
    current = folder
    while not os.path.lexists(current):
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    if os.path.lexists(current) and not os.path.isdir(current):
        raise NotADirectoryError(f"{current} is not a folder")
    created: list[Path] = []
    for path in reversed(missing):
        check_path(path.parent, root)
        try:
            os.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
            continue
        created.append(path)
    check_path(folder, root)
    return created


def write_file(
    path: Path,
    data: str | bytes,
    *,
    root: Path | None,
    encoding: str = "utf-8",
    mode: int | None = None,
) -> Path:
    """Give `path` the content `data`, atomically (a reader sees the old file or the new
    one), creating its folders; a link at `path` itself is replaced by the file."""
    path = Path(os.path.abspath(path))
    make_folder(path.parent, root)
    check_path(path.parent, root)
    _replace(path, data, encoding, DEFAULT_MODE if mode is None else mode)
    return path


def write_through(path: Path, data: str | bytes, *, root: Path | None, encoding: str = "utf-8") -> Path:
    """Rewrite the file `path` names (a source file edited in place): when `path` is a link,
    the file it leads to, which must be inside `root`; its permissions are kept."""
    path = Path(os.path.abspath(path))
    check_path(path, root)
    target = Path(_real(path))
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = DEFAULT_MODE
    _replace(target, data, encoding, mode)
    return target


def create_new(path: Path, data: str | bytes, *, root: Path | None, encoding: str = "utf-8") -> bool:
    """Create `path` only if nothing is there (a marker file: a cache's `.gitignore`);
    False when something is, a link included, which is left alone."""
    path = Path(os.path.abspath(path))
    make_folder(path.parent, root)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags, DEFAULT_MODE)
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "wb") as stream:
        stream.write(data.encode(encoding) if isinstance(data, str) else data)
    return True


def temporary_file(folder: Path, name: str, *, root: Path | None) -> Path:
    """A fresh, empty file in `folder` (created exclusively, of an unpredictable name) for a
    writer that takes a path (torch's exporters); `publish` renames it to its final name."""
    make_folder(folder, root)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.close(descriptor)
    os.chmod(temporary, DEFAULT_MODE)
    return Path(temporary)


def publish(temporary: Path, path: Path, *, root: Path | None) -> Path:
    """Rename `temporary` (from `temporary_file`) to `path`, replacing a link there."""
    path = Path(os.path.abspath(path))
    check_path(path.parent, root)
    os.replace(temporary, path)
    return path


def _replace(path: Path, data: str | bytes, encoding: str, mode: int) -> None:
    # mkstemp opens with O_CREAT | O_EXCL | O_NOFOLLOW under a random name.
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(data.encode(encoding) if isinstance(data, str) else data)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
