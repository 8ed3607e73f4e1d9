"""perf/_common.py's STALE mark in every bench's header: a compiled module is stale when its
``.pyx`` or a header it uses (``cdef extern from "x.h"``, ``cimport`` of a ``.pxd``) is newer
than its ``.so``; a header's name in the module's prose is not a use."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest

PERF = Path(__file__).resolve().parents[2] / "perf"


@pytest.fixture
def common(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(PERF))
    import _common

    return _common


def _tree(tmp_path: Path, sources: dict[str, str]) -> Path:
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
        if name.endswith(".pyx"):
            so = tmp_path / (name[:-4] + ".cpython-311-x86_64-linux-gnu.so")
            so.write_bytes(b"")
            os.utime(so, (1_000, 1_000))
            os.utime(tmp_path / name, (500, 500))
    for p in tmp_path.iterdir():
        if p.suffix in (".h", ".pxd"):
            os.utime(p, (2_000, 2_000))  # edited after every build
    return tmp_path


def test_a_newer_header_the_module_uses_makes_it_stale(common: ModuleType,
                                                       tmp_path: Path) -> None:
    src = _tree(tmp_path, {
        "atomics.pxd": "cdef extern from *:\n    pass\n",
        "_seqlock.h": "/* */\n",
        "ring.pyx": "from shmq._fast.atomics cimport shmq_full_fence\n",
        "lock.pyx": 'cdef extern from "_seqlock.h":\n    pass\n',
        "plain.pyx": "cimport atomics\n",
    })
    assert common._stale_extensions(src) == [
        "lock.pyx (via _seqlock.h)", "plain.pyx (via atomics.pxd)", "ring.pyx (via atomics.pxd)"]


def test_a_header_named_in_prose_is_not_a_use(common: ModuleType, tmp_path: Path) -> None:
    src = _tree(tmp_path, {
        "atomics.pxd": "cdef extern from *:\n    pass\n",
        "seqlock.pyx": '"""The atomics live in a header."""\nx = 1\n',
    })
    assert common._stale_extensions(src) == []
