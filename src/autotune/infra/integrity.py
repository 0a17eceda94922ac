"""Keys that sign what autotune stores, so that a row another user wrote or edited is not believed.

Each stored row carries HMAC-SHA256(key, row) (RFC 2104). The key is 32 random bytes that only the trusted
readers can read:
- a private cache: $XDG_CONFIG_HOME/autotune/cache-key (default ~/.config/autotune/cache-key), mode 0600, owned
  by this user; another user can neither read it nor, without it, make a row that verifies;
- a group-shared cache (a setgid directory others cannot write, infra/sharing.py): `.autotune-group-key` in that
  directory, mode 0640, of the directory's group; the group's members trust each other, nobody else can read it.
A key file that others could read or replace is refused (KeyRefused, with what to do), never silently used.
The key is made once, written to a temporary file and linked into place, so a concurrent first run never reads
half a key.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from autotune.infra.sharing import group_shared

KEY_BYTES = 32  # RFC 2104 sec. 3: at least the hash's output length (SHA-256: 32 bytes)
USER_KEY_NAME = "cache-key"
GROUP_KEY_NAME = ".autotune-group-key"


class KeyRefused(Exception):
    """The signing key cannot be trusted or made; the message says why and what to do."""


def config_dir() -> Path:
    """$XDG_CONFIG_HOME/autotune, else ~/.config/autotune (the XDG base directory spec's default)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "autotune"


def signing_key(cache_directory: Path) -> bytes:
    """The key for rows stored in `cache_directory`: its group's key when it is group-shared, else this user's."""
    if group_shared(cache_directory):
        return _key_file(cache_directory / GROUP_KEY_NAME, 0o640, _group_key_problem)
    directory = config_dir()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as error:
        raise KeyRefused(f"cannot create {directory} for the signing key ({error.strerror or error})") from None
    return _key_file(directory / USER_KEY_NAME, 0o600, _user_key_problem)


def sign(key: bytes, *parts: str) -> str:
    """HMAC-SHA256 over the parts, each length-prefixed so that no two splits of one text sign alike."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        data = part.encode()
        mac.update(len(data).to_bytes(8, "big") + data)
    return mac.hexdigest()


def verify(key: bytes, mac: object, *parts: str) -> bool:
    return isinstance(mac, str) and hmac.compare_digest(mac, sign(key, *parts))


def _user_key_problem(info: os.stat_result, path: Path) -> str | None:
    if info.st_uid != os.geteuid():
        return f"{path} is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()}): remove it"
    if info.st_mode & 0o077:
        return f"{path} is readable or writable by others (mode {stat.S_IMODE(info.st_mode):04o}): chmod 600 it"
    return None


def _group_key_problem(info: os.stat_result, path: Path) -> str | None:
    directory_group = os.stat(path.parent).st_gid
    if info.st_gid != directory_group:
        return f"{path} belongs to group {info.st_gid}, not the shared group {directory_group} of its directory"
    if info.st_mode & 0o007 or info.st_mode & 0o020:
        return f"{path} is open to others or writable by the group (mode {stat.S_IMODE(info.st_mode):04o}): chmod 640"
    return None


def _key_file(path: Path, mode: int, problem: Callable[[os.stat_result, Path], str | None]) -> bytes:
    if not path.exists() and not path.is_symlink():
        _create(path, mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        raise KeyRefused(f"cannot open the signing key {path} ({error.strerror or error})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise KeyRefused(f"the signing key {path} is not a regular file: remove it")
        if reason := problem(info, path):
            raise KeyRefused(f"the signing key {reason}")
        key = handle.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise KeyRefused(f"the signing key {path} is not {KEY_BYTES} bytes: remove it and a new one is made")
    return key


def _create(path: Path, mode: int) -> None:
    """Write a fresh key beside `path` and link it into place; whoever links first wins, the others read theirs."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # the umask may have narrowed it (a group key must be group-readable)
            handle.write(secrets.token_bytes(KEY_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    except OSError as error:
        raise KeyRefused(f"cannot create the signing key {path} ({error.strerror or error})") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
