"""Checks the wheel set make-wheels.sh built for the lent GPU machine (Python 3.12, no registry there).

    python3 benchmarks/gpu/check_wheels.py .whl [--py312 PATH] [--no-imports]

1. Pinned and complete: one version per package, each as benchmarks/gpu/wheels.txt pins it, and every
   Requires-Dist of every wheel (for CPython 3.12 on x86-64 Linux) met by the set, or by the GPU image where
   KINDS.md lists the package (at its seen version where one was seen).
2. Installable: `pip install --no-index --no-deps --target` with a Python 3.12 interpreter.
3. Importable at the set's floors: with Python 3.12, in a scratch venv holding only what the image provides
   (no torch: none for 3.12 is reachable here), pydantic, hjson, huggingface_hub and transformers import from the
   target; with this interpreter and its torch, deepspeed, transformers and pydantic import from the same pure
   wheels (plus this Python's builds of the set's binary ones at the same versions).
Exit 0 when all hold; else one line per problem and exit 1.
"""

from __future__ import annotations

import argparse
import email
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

HERE = Path(__file__).resolve().parent

# What the lent GPU image holds (its package list as read 2026-11-17; versions from its pip list row where
# it gives one, None where only the name is listed). A wheel's requirement on one of these is met by the image.
IMAGE = {
    "torch": "2.11.0", "numpy": "2.5.2", "tokenizers": "0.23.2", "safetensors": "0.8.0", "huggingface-hub": "1.33.0",
    "packaging": None, "pyyaml": None, "tqdm": None, "fsspec": None, "httpx": None, "psutil": None, "ninja": None,
    "nvidia-ml-py": None, "typer": None, "rich": None, "filelock": None, "click": None, "hf-xet": None,
}  # fmt: skip
# The image's packages a scratch 3.12 venv installs for the import check: the seen versions, else the registry's.
IMPORT_NAMES = {"pyyaml": "yaml", "nvidia-ml-py": "pynvml", "huggingface-hub": "huggingface_hub", "hf-xet": "hf_xet"}
IMPORT_BASE = ("numpy", "tokenizers==0.23.2", "safetensors==0.8.0", "packaging", "pyyaml", "tqdm", "fsspec", "httpx",
               "psutil", "typer", "rich")  # fmt: skip
IMPORTS_312 = ("typing_extensions", "pydantic", "hjson", "cpuinfo", "msgpack", "einops", "regex", "click",
               "huggingface_hub", "transformers")  # fmt: skip
ENV_312 = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "extra": ""}  # fmt: skip


def pins(path: Path = HERE / "wheels.txt") -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            found[canonicalize_name(name)] = version.strip()
    return found


def wheel_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        metadata = email.message_from_bytes(archive.read(name))
    requirements = [Requirement(text) for text in metadata.get_all("Requires-Dist") or []]
    return [r for r in requirements if r.marker is None or r.marker.evaluate(ENV_312)]


def check_set(wheels: list[Path], pinned: dict[str, str]) -> list[str]:
    """Problems with the set's versions: duplicates, pins not met, requirements nobody meets."""
    problems: list[str] = []
    versions: dict[str, Version] = {}
    for wheel in wheels:
        name, version, _build, _tags = parse_wheel_filename(wheel.name)
        if name in versions:
            problems.append(f"two versions of {name}: {versions[name]} and {version}")
        versions[name] = version
    for name, version in pinned.items():
        if name not in versions:
            problems.append(f"{name}=={version} is pinned but not in the set")
        elif versions[name] != Version(version):
            problems.append(f"{name} is {versions[name]} in the set, pinned {version}")
    for wheel in wheels:
        owner = parse_wheel_filename(wheel.name)[0]
        for requirement in wheel_requirements(wheel):
            name = canonicalize_name(requirement.name)
            have = versions.get(name) or (Version(IMAGE[name]) if IMAGE.get(name) else None)
            if have is None and name not in IMAGE:
                problems.append(f"{owner} needs {requirement}: neither carried nor in the GPU image")
            elif have is not None and not requirement.specifier.contains(have, prereleases=True):
                where = "the set" if name in versions else "the GPU image"
                problems.append(f"{owner} needs {requirement}, {where} has {have}")
    return problems


def find_python312(given: str | None) -> str | None:
    candidates = [given, os.environ.get("PY312"), shutil.which("python3.12"),
                  str(Path.home() / ".pyenv/versions/3.12.1/bin/python3.12")]  # fmt: skip
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            done = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                                  text=True, check=False)  # fmt: skip
            if done.stdout.strip() == "(3, 12)":
                return candidate
    return None


def _run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[arg-type]


def install(python: str, wheels: list[Path], target: Path) -> str | None:
    done = _run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target",
                 str(target), *map(str, wheels)])  # fmt: skip
    return None if done.returncode == 0 else f"pip install --target with {python} failed: {done.stderr[-800:]}"


def import_check(python: str, target: Path, modules: tuple[str, ...], extra_path: str = "") -> str | None:
    """Import modules with target first on the path; each must come from target (the set, not the base)."""
    code = (
        "import importlib, sys\n"
        f"target = {str(target)!r}\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    where = getattr(module, '__file__', '') or ''\n"
        "    assert where.startswith(target), f'{name} came from {where}, not the set'\n"
        "    print(name, getattr(module, '__version__', ''), where)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target) + (os.pathsep + extra_path if extra_path else ""),
           "TRANSFORMERS_VERBOSITY": "error", "DS_ACCELERATOR": "cpu"}  # fmt: skip
    done = _run([python, "-c", code], env=env)
    print(done.stdout, end="")
    return None if done.returncode == 0 else f"imports with {python} failed: {done.stderr.strip()[-1200:]}"


def base_venv(python312: str, where: Path) -> tuple[str | None, str | None]:
    """A 3.12 venv with the image's packages the set leans on (IMPORT_BASE), made once and reused."""
    python = where / "bin" / "python"
    if not python.exists():
        made = _run([python312, "-m", "venv", str(where)])
        if made.returncode != 0:
            return None, f"python3.12 -m venv failed: {made.stderr[-300:]}"
        got = _run([str(python), "-m", "pip", "install", "-q", *IMPORT_BASE], timeout=900)
        if got.returncode != 0:
            shutil.rmtree(where, ignore_errors=True)
            return None, f"the 3.12 import base did not install: {got.stderr[-500:]}"
    return str(python), None


def this_python_builds(wheels: list[Path], scratch: Path) -> tuple[list[Path], str | None]:
    """The set for this interpreter: its pure wheels, and this Python's builds of the binary ones (same version)."""
    pure = [w for w in wheels if w.name.endswith("-none-any.whl")]
    binary = [parse_wheel_filename(w.name)[:2] for w in wheels if w not in pure]
    scratch.mkdir(parents=True, exist_ok=True)
    got = _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(scratch),
                *(f"{name}=={version}" for name, version in binary)], timeout=600)  # fmt: skip
    if got.returncode != 0:
        return [], f"downloading this Python's builds of {binary} failed: {got.stderr[-400:]}"
    return pure + sorted(scratch.glob("*.whl")), None


def image_packages_here(target: Path) -> str | None:
    """The image's packages this interpreter lacks (httpx, say), installed with their needs after the set."""
    missing = [name for name in IMAGE if importlib.util.find_spec(IMPORT_NAMES.get(name, name)) is None]
    if not missing:
        return None
    got = _run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target), *missing], timeout=600)
    return None if got.returncode == 0 else f"installing the image's {missing} here failed: {got.stderr[-400:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheels", type=Path)
    parser.add_argument("--py312", default=None, help="a Python 3.12 (default: $PY312, python3.12, pyenv's 3.12.1)")
    parser.add_argument("--no-imports", action="store_true", help="metadata and install only")
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "autotune-wheels-py312")
    args = parser.parse_args(argv)
    wheels = sorted(args.wheels.glob("*.whl"))
    if not wheels:
        print(f"check_wheels: no wheels in {args.wheels}", file=sys.stderr)
        return 2
    problems = check_set(wheels, pins())
    print(f"set: {len(wheels)} wheels, {sum(w.stat().st_size for w in wheels) / 2**20:.1f} MiB, "
          f"{'consistent' if not problems else 'PROBLEMS'}")  # fmt: skip
    python312 = find_python312(args.py312)
    with tempfile.TemporaryDirectory(prefix="autotune-wheels-") as scratch:
        target = Path(scratch) / "site312"
        if python312 is None:
            problems.append("no Python 3.12 here: the install and 3.12 import checks did not run")
        elif (failed := install(python312, wheels, target)) is not None:
            problems.append(failed)
        else:
            print(f"installed with {python312} --no-index --no-deps --target: ok")
            if not args.no_imports:
                venv_python, failed = base_venv(python312, args.venv)
                problems += [failed] if failed else []
                if venv_python and (failed := import_check(venv_python, target, IMPORTS_312)):
                    problems.append(failed)
        if not args.no_imports:
            ours, failed = this_python_builds(wheels, Path(scratch) / "here")
            local, base = Path(scratch) / "site-here", Path(scratch) / "base-here"
            failed = failed or install(sys.executable, ours, local) or image_packages_here(base)
            failed = failed or import_check(sys.executable, local, ("pydantic", "transformers", "deepspeed"), str(base))
            problems += [failed] if failed else []
    for problem in problems:
        print(f"check_wheels: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
