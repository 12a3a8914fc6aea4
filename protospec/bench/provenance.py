"""Who, where, when: the fields every result file carries (device, date, git commit, command)."""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

import torch


def git_commit() -> str:
    """HEAD, or PROTOSPEC_GIT_COMMIT where the tree was copied without .git (the device machine)."""
    if os.environ.get("PROTOSPEC_GIT_COMMIT"):
        return os.environ["PROTOSPEC_GIT_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True, stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "unknown"


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


def provenance(device: torch.device, argv: list[str] | None = None, module: str = "protospec.bench") -> dict:
    args = sys.argv[1:] if argv is None else argv
    return {
        "device": describe_device(device),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
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
    from pathlib import Path

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
