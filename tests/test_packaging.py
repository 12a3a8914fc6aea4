"""environment.yml (conda) and pyproject.toml (pip) must list the same packages, and every package the
code imports."""
import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONDA_TO_PIP = {"pytorch": "torch"}
NOT_PACKAGES = {"python", "pip"}


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ ]", spec.strip(), maxsplit=1)[0].lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_names = {_name(d) for d in project["dependencies"]}
    pip_names |= {_name(d) for extra in project["optional-dependencies"].values() for d in extra}
    conda_names, in_deps = set(), False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if not line.startswith(" "):
            in_deps = line.startswith("dependencies:")
        m = re.match(r"^  - ([A-Za-z0-9_.\-]+)(?!:)", line)  # "  - name..." directly under dependencies
        if in_deps and m and not line.rstrip().endswith(":"):
            name = _name(m.group(1))
            conda_names.add(CONDA_TO_PIP.get(name, name))
    assert conda_names - NOT_PACKAGES == pip_names
    assert "-e ." in (ROOT / "environment.yml").read_text()


def test_design_card_packages_are_all_required():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {_name(d) for d in project["dependencies"]}
    assert {"torch", "numba", "numba-cuda", "numpy", "jupyterlab", "matplotlib", "transformers"} <= names


# import name -> distribution name, for the third-party packages the code imports
IMPORT_TO_DIST = {"yaml": "pyyaml", "numba_cuda": "numba-cuda"}
STDLIB_OR_OWN = {"protospec", "tests", "__future__"}


def test_every_third_party_import_is_declared():
    import sys

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(d).replace("-", "_") for d in project["dependencies"]}
    imported = set()
    for path in (ROOT / "protospec").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {IMPORT_TO_DIST.get(n, n).replace("-", "_") for n in imported
                   if n not in sys.stdlib_module_names and n not in STDLIB_OR_OWN}
    assert third_party - declared == set(), "imported but not declared in pyproject.toml"
