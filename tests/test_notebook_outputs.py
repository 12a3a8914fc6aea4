"""The committed notebooks' outputs are what a reader sees on GitHub: no warnings or other stderr
streams, no absolute paths of the machine that executed them, the live runs' real commands."""
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
ABSOLUTE_PATH = re.compile(r"(?<![\w.])(/(?:work|home|root|tmp|Users|private|var/folders)/|[A-Z]:\\\\)")


def _outputs(path: Path):
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        for output in cell.get("outputs", []):
            yield index, output


def _text(output) -> str:
    parts = [output.get("text", "")]
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/"):
            parts.append(value)
    parts.append("".join(output.get("traceback", [])))
    return "".join("".join(p) if isinstance(p, list) else p for p in parts)


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_outputs_are_clean(path):
    problems = []
    for index, output in _outputs(path):
        text = _text(output)
        if output.get("output_type") == "stream" and output.get("name") == "stderr":
            problems.append(f"cell {index}: stderr output {text[:80]!r}")
        if output.get("output_type") == "error":
            problems.append(f"cell {index}: error {output.get('ename')}")
        if ABSOLUTE_PATH.search(text):
            problems.append(f"cell {index}: absolute path {ABSOLUTE_PATH.search(text).group(0)!r} in {text[:80]!r}")
        if "(notebook live run)" in text:
            problems.append(f"cell {index}: a placeholder instead of the live run's command")
    assert problems == []
