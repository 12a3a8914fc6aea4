"""The package's shape, checked: no import circle, each draft-loop name spelled in one module, no reaching
into another package's private attributes, Numba array sizes the GPU typer accepts."""
import ast
import re
from pathlib import Path

from protospec import registry

PACKAGE = Path(__file__).resolve().parents[1] / "protospec"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _top_level_imports(path: Path, known: set[str]) -> set[str]:
    """protospec modules imported when this module is imported (module level, not under TYPE_CHECKING,
    not inside functions)."""
    out = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body + node.orelse + getattr(node, "finalbody", []) +
                      [n for h in getattr(node, "handlers", []) for n in h.body])
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("protospec"):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    out.add(sub if sub in known else node.module)

    visit(ast.parse(path.read_text()).body)
    return out


def test_no_import_circle():
    modules = _modules()
    # A package's own __init__ importing its submodules is the usual pattern, not a circle: edges to a
    # module's own parent packages are left out.
    graph = {name: {dep for dep in _top_level_imports(path, set(modules)) if not name.startswith(dep + ".")} - {name}
             for name, path in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node):
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(dep):] + [dep]))
            if dep not in state:
                dfs(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            dfs(name)


def test_the_kernels_are_the_lowest_layer():
    """protospec/kernels imports only itself and the shared foundations (errors, layout, and the ending of
    commands, which needs only errors), so a kernel can be read, tested and timed without the model or
    the spec step."""
    modules = _modules()
    allowed = ("protospec.kernels", "protospec.errors", "protospec.layout", "protospec.command_line")
    offenders = {name: sorted(dep for dep in _top_level_imports(path, set(modules)) if not dep.startswith(allowed))
                 for name, path in modules.items() if name.startswith("protospec.kernels")}
    assert not {name: deps for name, deps in offenders.items() if deps}


# The packages' layers, lowest first: a module imports (at module level) only from its own layer or below.
# The foundations are single modules everyone uses; registry holds only names.
LAYERS = (
    ("protospec.errors", "protospec.layout", "protospec.device_wait", "protospec.command_line", "protospec.registry",
     "protospec.config", "protospec.kernel_plan"),
    ("protospec.kernels.launch",),
    ("protospec.kernels.primitives",),
    ("protospec.kernels",),
    ("protospec.model",),
    ("protospec.requests",),
    ("protospec.speculation",),
    ("protospec.engine",),
    ("protospec", "protospec.lab", "protospec.bench", "protospec.train"),
)


def _layer(module: str) -> int:
    best = (-1, -1)  # (length of the longest matching prefix, its layer)
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best[0]:
                best = (len(prefix), level)
    return best[1]


def test_the_packages_form_layers():
    """requests/ sits below speculation/ and engine/, speculation/ below engine/: no package reaches up."""
    modules = _modules()
    upward = {}
    for name, path in modules.items():
        for dep in _top_level_imports(path, set(modules)):
            if _layer(dep) > _layer(name):
                upward.setdefault(name, []).append(dep)
    assert upward == {}


def test_each_draft_loop_name_is_spelled_in_the_registry_only():
    names = set(registry.DRAFT_LOOPS) | set(registry.ARMS)
    pattern = re.compile(r"""["'](%s)["']""" % "|".join(sorted(names)))
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "registry.py":
            continue
        code = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        tree = ast.parse(path.read_text())
        docstrings = {ast.get_docstring(n, clean=False) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))} - {None}
        for doc in docstrings:
            code = code.replace(doc, "")
        offenders += [f"{path.relative_to(PACKAGE)}: {m.group(0)}" for m in pattern.finditer(code)]
    assert not offenders, offenders


def _package_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0] if len(path.relative_to(PACKAGE).parts) > 1 else ""


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_reaches_into_another_packages_private_attributes():
    """`other._name`, where protospec defines `_name` in another subpackage than the one reading it."""
    trees = {path: ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}
    defined: dict[str, set[str]] = {}  # private attribute or method name -> packages defining it
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and _private(node.name):
                defined.setdefault(node.name, set()).add(_package_of(path))
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _private(node.attr):
                defined.setdefault(node.attr, set()).add(_package_of(path))
    offenders = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and _private(node.attr):
                owners = defined.get(node.attr, set())
                if owners and _package_of(path) not in owners and ast.unparse(node.value) not in ("self", "cls"):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert not offenders, offenders


def array_sizes_that_are_expressions(source: str) -> list[str]:
    """cuda.shared.array / cuda.local.array calls whose size is an expression, not a name or number.
    Numba's GPU typer takes only literal sizes (a closure constant or a number) and the CUDA simulator
    accepts anything, so a CPU run cannot catch this: the kernel fails to compile on the first GPU."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "array"
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr in ("shared", "local")
                and node.args and not isinstance(node.args[0], (ast.Name, ast.Constant, ast.Tuple))):
            bad.append(ast.unparse(node))
    return bad


def test_kernel_array_sizes_are_literals():
    bad = {str(p.relative_to(PACKAGE)): found for p in (PACKAGE / "kernels").rglob("*.py")
           if (found := array_sizes_that_are_expressions(p.read_text()))}
    assert not bad, f"take the product outside the kernel (a closure constant): {bad}"
    # the check itself catches the mistake it is for
    assert array_sizes_that_are_expressions("s = cuda.shared.array(R * D, float32)") == ["cuda.shared.array(R * D, float32)"]
    assert array_sizes_that_are_expressions("s = cuda.local.array(CELLS, float32)") == []


def _protospec_module_names(tree: ast.AST, known: set[str]) -> dict[str, str]:
    """Local names bound to protospec modules anywhere in a file (import x.y as z, from x import y)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known and a.asname:
                    bound[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("protospec"):
            for a in node.names:
                if f"{node.module}.{a.name}" in known:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
    return bound


def _outside_global_writes(path: Path, known: set[str]) -> list[str]:
    """Where this file sets an UPPER_CASE global of a protospec module it imported: an assignment (or a
    loop / with target) to module.NAME, or monkeypatch.setattr(module or "protospec.x.y", "NAME", ...)."""
    tree = ast.parse(path.read_text())
    bound = _protospec_module_names(tree, known)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                and node.value.id in bound and node.attr.isupper()):
            found.append(f"{path.name}:{node.lineno} {bound[node.value.id]}.{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and str(node.args[1].value).isupper()):
            target = node.args[0]
            module = (bound.get(target.id) if isinstance(target, ast.Name) else
                      target.value if isinstance(target, ast.Constant) and str(target.value) in known else None)
            if module is not None:
                found.append(f"{path.name}:{node.lineno} {module}.{node.args[1].value}")
    return found


# Set from outside on purpose, each for a stated reason: sizes a test shrinks so the simulator reaches a
# multi-block or multi-chunk branch in seconds, or a GPU test reaches a batch-size branch with a small
# batch; the GPU build check, which reroutes every launch of the package to Numba's compiler on a
# machine without a GPU.
SET_FROM_OUTSIDE = {
    "protospec.kernels.sampling.rejection.THREADS", "protospec.kernels.primitives.reductions.SHUFFLE_LANES",
    "protospec.kernels.sampling.gumbel_sample.THREADS", "protospec.kernels.sampling.gumbel_sample.VOCAB_PER_BLOCK",
    "protospec.model.inputs.LOOP_MAX_TOKENS", "protospec.model.layer_kernels.MAX_QUERY_LEN",
    "protospec.model.graphs.MAX_PREFILL_GRAPHS", "protospec.speculation.step_graph.LOGITS_MIN_ROWS",
    "protospec.kernels.launch.interop.KERNEL_DEVICE_TYPE",
}


def test_no_module_global_is_set_from_outside_its_module():
    """Kernel choices live in the engine's KernelPlan, passed to the forwards that use them: no
    process-wide switch that a bench, a script or a test flips behind an engine's back (two engines in
    one process could not differ, and a record could not say which kernels made it)."""
    known = set(_modules())
    root = PACKAGE.parent
    files = [*PACKAGE.rglob("*.py"), *(root / "tests").glob("*.py"), *(root / "scripts").rglob("*.py"),
             *(root / "tools").rglob("*.py")]
    offenders = [hit for path in files for hit in _outside_global_writes(path, known)
                 if hit.split()[1] not in SET_FROM_OUTSIDE]
    assert offenders == []
