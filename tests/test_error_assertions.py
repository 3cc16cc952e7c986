"""Every error assertion in the suite pins the status or the code, not only the class.

``pytest.raises(ServerError)`` alone also passes when a fake crashes (a 500), when a 503 becomes a
502, or when a deadline that should say ``timeout`` says ``network_error``: the class is too coarse
to tell a real answer from an accident. So wherever a test expects one of dispatch_nb's errors —
``with pytest.raises(SomeError) as info`` or ``assert isinstance(x, SomeError)`` — the same test
also reads ``info.value.code`` / ``.status_code`` (or ``x.code`` / ``x.status_code``).

This test reads the suite's source (``ast``), so it covers tests that are not run here too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PACKAGE = ROOT.parent / "dispatch_nb"
PINS = frozenset({"code", "status_code"})


def error_family() -> set[str]:
    """Names of DispatchError and of every class in the package that derives from it."""
    bases: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                bases.setdefault(node.name, set()).update(names)
    family = {"DispatchError"}
    while True:
        grown = family | {name for name, parents in bases.items() if parents & family}
        if grown == family:
            return family
        family = grown


def _names(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Tuple):
        return [n for element in node.elts for n in _names(element)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def _pinned(test: ast.AST) -> set[str]:
    """Expressions (as source) whose ``.code`` or ``.status_code`` the test reads, with the
    names assigned from them (``err = info.value`` pins ``info.value`` through ``err``)."""
    read = {ast.unparse(n.value) for n in ast.walk(test) if isinstance(n, ast.Attribute) and n.attr in PINS}
    for node in ast.walk(test):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and ast.unparse(node.targets[0]) in read):
            read.add(ast.unparse(node.value))
    return read


def loose_assertions(source: str, where: str, family: set[str]) -> list[str]:
    """``where:line: assertion`` for each class-only error assertion in ``source``."""
    tree = ast.parse(source)
    found: list[str] = []
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    tests = [n for n in ast.walk(tree) if isinstance(n, functions)]
    nested = {id(inner) for t in tests for inner in ast.walk(t) if inner is not t
              and isinstance(inner, functions)}
    for test in (t for t in tests if id(t) not in nested):
        pinned = _pinned(test)
        for node in ast.walk(test):
            if isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    call = item.context_expr
                    if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "pytest.raises"
                            and call.args and set(_names(call.args[0])) & family):
                        continue
                    name = item.optional_vars
                    if not (isinstance(name, ast.Name) and f"{name.id}.value" in pinned):
                        found.append(f"{where}:{node.lineno}: {ast.unparse(call)}")
            elif (isinstance(node, ast.Call) and ast.unparse(node.func) == "isinstance"
                  and len(node.args) == 2 and set(_names(node.args[1])) & family
                  and ast.unparse(node.args[0]) not in pinned):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_error_family_is_found() -> None:
    family = error_family()
    assert {"ServerError", "APITimeoutError", "RequestCancelled", "ContextLengthError"} <= family
    assert {"CacheMissError", "DeviceFlowDenied", "UnknownProviderError"} <= family


def test_the_checker_catches_a_class_only_assertion() -> None:
    source = (
        "def test_loose():\n    with pytest.raises(ServerError):\n        go()\n"
        "def test_pinned():\n    with pytest.raises(ServerError) as info:\n        go()\n"
        "    assert info.value.status_code == 503\n"
        "def test_alias():\n    with pytest.raises(APITimeoutError) as info:\n        go()\n"
        "    err = info.value\n    assert err.code == 'timeout'\n"
        "def test_isinstance():\n    assert isinstance(result.error, RequestError)\n"
        "def test_isinstance_pinned():\n    assert isinstance(e, RequestError) and e.code == 'x'\n"
        "def test_not_ours():\n    with pytest.raises(ValueError):\n        go()\n"
    )
    found = loose_assertions(source, "sample.py", error_family())
    assert found == ["sample.py:2: pytest.raises(ServerError)",
                     "sample.py:14: isinstance(result.error, RequestError)"]


def test_every_error_assertion_pins_the_status_or_the_code() -> None:
    family = error_family()
    found = [
        finding
        for path in sorted(ROOT.rglob("*.py"))
        for finding in loose_assertions(
            path.read_text(encoding="utf-8"), str(path.relative_to(ROOT.parent)), family
        )
    ]
    assert not found, (
        f"{len(found)} error assertions check only the class; read info.value.code or "
        ".status_code too:\n" + "\n".join(found)
    )
