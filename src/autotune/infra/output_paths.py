"""Where autotune may write, decided before any work: a bad --out costs one line, not a tuning.

Found by a hostile-input session (as root, as ML containers run): `--out /dev/full` replaced the device node
with a regular file after a 35 s tuning, `--out` a symlink to /proc/self/fd/1 tuned and wrote nowhere useful,
`--cache-dir /proc/x` gave a traceback. So every output path (--out, --report-dir, --cache-dir, check --fix)
must be, or be creatable as, a regular file or a directory on a writable, ordinary filesystem:

- an existing target (through a symlink: its target) of another type (FIFO, socket, device) is refused;
- nothing is written under /proc, /sys or /dev (bar /dev/shm, an ordinary tmpfs), nor on a kernel pseudo
  filesystem mounted elsewhere, nor on a read-only mount (root passes `os.access` there, so statvfs decides);
- a symlink named as the output must point inside its own directory: a link that leads elsewhere (a planted
  `ds.json -> ~/.bashrc` in a shared directory) is refused, and the user names the real path instead;
- the link is followed hop by hop (`os.readlink`), not through `os.path.realpath`: `/proc/self/fd/1` is a magic
  link that realpath resolves to whatever the caller's stdout is (issue 46: a log file in the link's own
  directory passed the check and was replaced by the config after a 129 s tuning), so any hop into /proc, /sys
  or /dev is refused, and so is a directory of the path that resolves there;
- a symlink onto an existing file is followed only onto autotune's own earlier output (its `.autotune.json`
  stands beside it, as every tuning writes it): any other existing file is one the user did not name;
- the files written beside the config (`.hf.json`, `.accelerate.yaml`, `.autotune.json`) and the reports are
  named from the config's real path and vetted by the same rules (`vet_tuning_outputs`), none of them a symlink.

The atomic writer (infra/atomic.py) re-checks the type at write time, so a node planted after this check is still
never replaced.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from autotune.errors import UserError

# Kernel filesystems whose files are interfaces, not storage (Linux `/proc/filesystems` names).
PSEUDO_FILESYSTEMS = frozenset(
    {
        "proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
        "pstore", "bpf", "configfs", "fusectl", "mqueue", "binfmt_misc", "efivarfs", "rpc_pipefs", "nsfs",
        "autofs", "hugetlbfs",
    }
)  # fmt: skip
SYSTEM_TREES = ("/proc", "/sys", "/dev")
ORDINARY_UNDER_SYSTEM = ("/dev/shm",)  # POSIX shared memory: a plain tmpfs, where files are files


def file_kind(mode: int) -> str:
    """'a FIFO', 'a character device', ...: what a non-regular file is, for the refusal line."""
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _under(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _mount_type(real: str) -> str | None:
    """The filesystem type of the mount holding `real` (longest mount point that contains it)."""
    import psutil

    try:
        mounts = psutil.disk_partitions(all=True)
    except (OSError, RuntimeError):
        return None
    holding = [m for m in mounts if _under(real, m.mountpoint)]
    return max(holding, key=lambda m: len(m.mountpoint)).fstype if holding else None


MAX_LINK_HOPS = 40  # Linux's own limit on symlinks followed in one path lookup (MAXSYMLINKS, path_resolution(7))
OWN_OUTPUT_SUFFIX = ".autotune.json"  # report/assumptions.py SUFFIX: beside every config a tuning wrote


def _link_hops(path: Path) -> list[str]:
    """The paths a symlink leads through, one `readlink` at a time (never realpath: see the module docstring)."""
    hops: list[str] = []
    current = os.path.abspath(path)
    while os.path.islink(current):
        if len(hops) >= MAX_LINK_HOPS:
            break
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
        hops.append(current)
    return hops


def _in_system_tree(path: str) -> str | None:
    if any(_under(path, tree) for tree in ORDINARY_UNDER_SYSTEM):
        return None
    return next((tree for tree in SYSTEM_TREES if _under(path, tree)), None)


def _is_own_output(real: str) -> bool:
    target = Path(real)
    return target.with_name(target.stem + OWN_OUTPUT_SUFFIX).is_file()


def _refuse_symlink_out(path: Path, flag: str) -> None:
    """A symlink named as an output leads, hop by hop, inside the directory that holds it, through no system
    tree, and onto nothing but a new file or autotune's own earlier output."""
    if not path.is_symlink():
        return
    link = os.readlink(path)
    hops = _link_hops(path)
    for hop in (os.path.abspath(path), *hops):
        if tree := _in_system_tree(hop) or _in_system_tree(os.path.realpath(os.path.dirname(hop))):
            raise UserError(f"{flag} {path} is a symlink to {link}, which leads under {tree}; name the file to write")
    home = os.path.realpath(path.parent)
    real = os.path.realpath(path)
    if len(hops) >= MAX_LINK_HOPS or not _under(real, home):
        leads = link if real == link else f"{link} (so {real})"
        raise UserError(f"{flag} {path} is a symlink to {leads}, outside {home}; name the file to write directly")
    if os.path.lexists(real) and not _is_own_output(real):
        raise UserError(
            f"{flag} {path} is a symlink onto the existing file {real}, which autotune did not write;"
            " name the file to write directly"
        )


def _refuse_system_location(real: str, flag: str, given: Path) -> None:
    # the directory resolved apart from the name: `fd/1` with `fd -> /proc/self/fd` resolves, as a whole, to
    # the caller's stdout (a magic link), but its directory is under /proc
    home = os.path.realpath(given.parent)
    tree = _in_system_tree(real) or _in_system_tree(home)
    if tree is None and any(_under(real, t) for t in ORDINARY_UNDER_SYSTEM):
        return
    fstype = _mount_type(real)
    if tree or fstype in PSEUDO_FILESYSTEMS:
        where = f"under {tree}" if tree else f"on a {fstype} filesystem"
        shown = given if str(given) == real else f"{given} ({real})"
        raise UserError(f"{flag} {shown} is {where}, which holds kernel interfaces, not files; write somewhere else")


def _usable_ancestor(real: Path, flag: str) -> None:
    """The nearest existing ancestor is a directory we can create entries in, on a writable mount."""
    for parent in (real, *real.parents):
        try:
            info = os.stat(parent)
        except FileNotFoundError:
            continue
        except OSError as error:
            raise UserError(f"{flag}: cannot examine {parent}: {error.strerror or error}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise UserError(f"{flag}: {parent} is {file_kind(info.st_mode)}, not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UserError(f"{flag}: cannot write under {parent} (permission denied)")
        if os.statvfs(parent).f_flag & os.ST_RDONLY:
            raise UserError(f"{flag}: {parent} is on a read-only filesystem")
        return


def _vet(text: str | os.PathLike[str], flag: str, want_dir: bool) -> Path:
    if "\0" in os.fspath(text):
        raise UserError(f"{flag} contains a NUL byte")
    given = Path(text)
    _refuse_symlink_out(given, flag)
    real = os.path.realpath(given)
    _refuse_system_location(real, flag, given)
    try:
        info = os.stat(real)
    except FileNotFoundError:
        info = None
    except OSError as error:
        raise UserError(f"{flag} {given}: {error.strerror or error}") from None
    if info is not None:
        if want_dir and not stat.S_ISDIR(info.st_mode):
            raise UserError(f"{flag} {given} is {file_kind(info.st_mode)}; it names a directory")
        if not want_dir and stat.S_ISDIR(info.st_mode):
            raise UserError(f"{flag} {given} is a directory; give a file path such as {given / 'ds_config.json'}")
        if not want_dir and not stat.S_ISREG(info.st_mode):
            raise UserError(f"{flag} {given} is {file_kind(info.st_mode)}, not a regular file; it is never replaced")
    _usable_ancestor(Path(real) if want_dir else Path(real).parent, flag)
    return given


def vet_output_file(path: str | os.PathLike[str], flag: str) -> Path:
    """`path` may be written as a regular file (see the module docstring), else UserError with one line."""
    return _vet(path, flag, want_dir=False)


def vet_output_dir(path: str | os.PathLike[str], flag: str) -> Path:
    """`path` is, or may be created as, a directory to write files in; else UserError with one line."""
    return _vet(path, flag, want_dir=True)


def beside_config(config_path: Path) -> tuple[Path, ...]:
    """The files every tuning writes beside its config (dsconfig/emit.py, report/assumptions.py)."""
    return (
        config_path.with_suffix(".hf.json"),
        config_path.with_suffix(".accelerate.yaml"),
        config_path.with_name(config_path.stem + OWN_OUTPUT_SUFFIX),
    )


REPORT_FILES = ("autotune-report.md", "autotune-report.json", "autotune-report.png")  # report/markdown.py REPORT_STEM


def _vet_written_file(path: Path, flag: str) -> None:
    """A file autotune names itself: a regular file or nothing, never a symlink (nobody named it to follow)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise UserError(f"{flag}: cannot examine {path}: {error.strerror or error}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{flag}: {path}, written beside it, is {file_kind(mode)}; it is never replaced or followed")


def vet_tuning_outputs(out: str | os.PathLike[str], report_dir: str | os.PathLike[str] | None) -> None:
    """--out, every file written beside the config and the reports, vetted before any work (one line each)."""
    given = vet_output_file(out, "--out")
    config_path = Path(os.path.realpath(given)) if given.is_symlink() else given  # request.tune_request.output_path
    for beside in beside_config(config_path):
        _vet_written_file(beside, "--out")
    reports = Path(report_dir) if report_dir else given.parent
    if report_dir:
        vet_output_dir(report_dir, "--report-dir")
    for name in REPORT_FILES:
        _vet_written_file(reports / name, "--report-dir" if report_dir else "--out")
