"""The training corpus: every .py file of the running interpreter's standard library.

It is on every machine, so the pair can be retrained anywhere, offline. A fixed ~5% of the files,
chosen by a hash of their path relative to the stdlib root (so the choice does not depend on the
machine or on file order), is held out for evaluation and never trained on.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELDOUT_PERCENT = 5


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relative_path: str) -> bool:
    return hashlib.sha1(relative_path.encode()).digest()[0] * 100 < HELDOUT_PERCENT * 256


@dataclass
class Corpus:
    root: Path
    train_files: list[Path]
    heldout_files: list[Path]

    @classmethod
    def from_stdlib(cls, max_files: int | None = None) -> "Corpus":
        root = stdlib_root()
        files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.relative_to(root).parts)
        if max_files is not None:  # small runs (tests): an evenly spaced subset
            files = files[:: max(1, len(files) // max_files)][:max_files]
        held = [p for p in files if is_heldout(p.relative_to(root).as_posix())]
        train = [p for p in files if not is_heldout(p.relative_to(root).as_posix())]
        return cls(root, train, held)

    @staticmethod
    def read(files: list[Path]) -> list[str]:
        return [p.read_text(encoding="utf-8", errors="replace") for p in files]

    def describe(self) -> dict:
        return {"root": str(self.root), "train_files": len(self.train_files), "heldout_files": len(self.heldout_files),
                "heldout_rule": f"sha1(path relative to the stdlib root)[0] < {HELDOUT_PERCENT}% of 256",
                "heldout_examples": [p.relative_to(self.root).as_posix() for p in self.heldout_files[:10]]}
