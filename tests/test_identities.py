"""Identities are objects or enums, never strings compared in passing (issue: the redesign).

No module of ``plan``, ``shaders``, ``vk`` or ``runtime`` compares a string to a primitive
name, a buffer role or a buffer-name prefix: they compare ``Prim`` objects and
``BufferRole`` members. The scan reads the syntax tree, so comments and docstrings do not
count, and it is checked against a planted offender so it can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

from pootvk.ir import PRIMS
from pootvk.plan import BufferRole

ROOT = Path(__file__).resolve().parent.parent / "pootvk"
PACKAGES = ("plan", "shaders", "vk", "runtime")
NAMES = set(PRIMS) | {r.value for r in BufferRole} | {"input", "export"}
PREFIXES = ("in:", "state:", "out:", "param:", "const:", "arena")


def _identity_string(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        s = node.value
        if s in NAMES or s.startswith(PREFIXES):
            return s
    return None


def offenders(source: str) -> list[str]:
    """Comparisons (==, !=, in, is) and startswith/endswith calls on identity strings."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op in operands:
                elts = op.elts if isinstance(op, ast.Tuple | ast.List | ast.Set) else [op]
                bad += [f"line {node.lineno}: {s!r}" for e in elts
                        if (s := _identity_string(e))]
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "endswith")
        ):
            bad += [f"line {node.lineno}: {s!r}" for a in node.args if (s := _identity_string(a))]
    return bad


def test_the_scan_finds_a_planted_string_compare():
    assert offenders('if e.prim == "Attention": pass')
    assert offenders('ok = spec.role in ("input", "state")')
    assert offenders('name.startswith("state:")')
    assert not offenders('if e.prim is ATTENTION: pass\nx = "Attention"')


def test_no_string_compares_on_primitives_or_roles():
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            bad = offenders(path.read_text())
            if bad:
                found[str(path.relative_to(ROOT))] = bad
    assert not found, found
