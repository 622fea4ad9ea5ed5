"""The package's shape (issue 31): no import circle among fusedopt's modules.

Every import of a fusedopt module counts, also those inside functions (a deferred import
is how a circle hides). A module importing ``fusedopt.x`` depends on ``x``; importing a
package means its ``__init__``.
"""
import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "python", "fusedopt")


def _modules():
    """{dotted module name: path} of every .py file of the package."""
    found = {}
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                found[".".join(rel)] = path
    return found


def _imports(path, modules, package):
    """The fusedopt modules `path` imports (anywhere in it)."""
    tree = ast.parse(open(path).read(), path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            # `from pkg import sub` depends on pkg.sub; `from pkg import name` on pkg
            names = [base + "." + a.name if base + "." + a.name in modules else base
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name.startswith("fusedopt"):
                out.add(name)
    return out


def import_graph():
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        graph[name] = _imports(path, modules, package) - {name}
    return graph


def find_cycle(graph):
    """One import circle as a list of modules, or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt, stack)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            if cycle:
                return cycle
    return None


def test_no_import_circle():
    graph = import_graph()
    assert "fusedopt.ops" in graph and "fusedopt._packs" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_circle_check_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_test_folder_is_collected(request):
    """pytest skips folders matching norecursedirs (its default has "build"): a folder of
    tests named like one would silently never run."""
    import fnmatch

    tests = os.path.join(os.path.dirname(PACKAGE), os.pardir, "tests")
    patterns = request.config.getini("norecursedirs")
    folders = [d for d in os.listdir(tests) if os.path.isdir(os.path.join(tests, d))
               and any(f.startswith("test_") for f in os.listdir(os.path.join(tests, d)))]
    assert len(folders) >= 8, folders
    hidden = [d for d in folders if any(fnmatch.fnmatch(d, p) for p in patterns)]
    assert not hidden, (hidden, patterns)
    assert any(fnmatch.fnmatch("build", p) for p in patterns)  # the check can fail
