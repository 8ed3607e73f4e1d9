"""Debian programs the integration tests run (kcat, Burrow, ZooKeeper), installed by ``make setup``.

Where one is missing the test that needs it is skipped, except in CI (``CI`` set, as ``.ci/run``
runs): there a missing package is a failure, since the setup should have installed it.
"""

from __future__ import annotations

import os
import shutil

import pytest


def require(program: str, package: str) -> str:
    """The path of ``program`` (from Debian's ``package``), or skip (fail in CI) without it."""
    path = shutil.which(program) or (program if os.path.isabs(program)
                                     and os.path.exists(program) else None)
    if path is None:
        reason = f"{program} is not installed (Debian package {package}: `make setup` installs it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path
