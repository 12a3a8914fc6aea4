"""Who, where, when: the fields every result file carries (device, date, git commit, command)."""
from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import torch


# The directory holding the package: a checkout's top level when protospec runs from its repository.
CHECKOUT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        return subprocess.check_output(["git", "-C", str(CHECKOUT), *args], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:  # no git, or not a repository
        return None


def source_hash() -> str:
    """sha256 over the package's Python files (relative path and bytes, in path order)."""
    digest = hashlib.sha256()
    package = CHECKOUT / "protospec"
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def source_identity() -> dict:
    """Which code made a record. git_commit: HEAD of protospec's own repository, only where the
    package's directory is that repository's top level (a copy of the tree inside another checkout
    would otherwise name that checkout's commit); tree_dirty: whether tracked files differed from it.
    PROTOSPEC_GIT_COMMIT names the commit of a copy made without .git (the device machine). Otherwise
    git_commit is "unknown" and the package's version and source_sha256 (source_hash) say which code ran."""
    if os.environ.get("PROTOSPEC_GIT_COMMIT"):
        return {"git_commit": os.environ["PROTOSPEC_GIT_COMMIT"], "tree_dirty": None}
    top = _git("rev-parse", "--show-toplevel")
    if top is not None and Path(top).resolve() == CHECKOUT:
        commit = _git("rev-parse", "HEAD")
        status = _git("status", "--porcelain", "--untracked-files=no")
        if commit:
            return {"git_commit": commit, "tree_dirty": bool(status)}
    try:
        version = importlib.metadata.version("protospec")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"git_commit": "unknown", "tree_dirty": None, "package_version": version, "source_sha256": source_hash()}


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


def provenance(device: torch.device, argv: list[str] | None = None, module: str = "protospec.bench") -> dict:
    args = sys.argv[1:] if argv is None else argv
    return {
        "device": describe_device(device),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **source_identity(),
        "command": shlex.join(["python", "-m", module, *args]),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
    }


def write_report(path: str | None, report: dict) -> None:
    """Write a run's report as indented JSON when a path was asked for."""
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)


def check_writable(path: str | None, directory: bool = False) -> None:
    """Before a long run: refuse an output path that cannot be written (the results would be lost at
    the end). A directory is created if missing; a file's directory must exist."""
    if not path:
        return
    target = Path(path)
    if target.is_dir() and not directory:
        raise SystemExit(f"cannot write {target}: it is a directory; give a file path (e.g. {target / 'results.json'})")
    folder = target if directory else target.parent
    if directory:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SystemExit(f"cannot create the output directory {folder}: {e.strerror or e}") from e
    if not folder.is_dir():
        raise SystemExit(f"cannot write {target}: the directory {folder} does not exist")
    if not os.access(folder, os.W_OK) or (target.exists() and not directory and not os.access(target, os.W_OK)):
        raise SystemExit(f"cannot write {target}: permission denied")
