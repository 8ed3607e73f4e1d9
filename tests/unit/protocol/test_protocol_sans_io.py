"""The protocol package is sans-io (STYLE.md §1): no sockets, event loops, or broker layers."""

from __future__ import annotations

import ast
import pathlib

import shmq.protocol

FORBIDDEN = ("socket", "selectors", "asyncio", "shmq.storage", "shmq.broker", "shmq.net")


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_io_imports():
    package = pathlib.Path(shmq.protocol.__file__).parent
    for path in sorted(package.glob("*.py")):
        for name in _imports(path):
            assert not any(name == f or name.startswith(f + ".") for f in FORBIDDEN), (path, name)
