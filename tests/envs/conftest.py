"""The user's package of the suite-plugin tests (tests/envs/test_suite_plugins.py), for every test here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.envs.test_suite_plugins import USER_SUITE


@pytest.fixture
def user_pkg(tmp_path, monkeypatch) -> Path:
    pkg = tmp_path / "site" / "usertasks"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "echo.py").write_text(USER_SUITE)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [m for m in sys.modules if m == "usertasks" or m.startswith("usertasks.")]:
        monkeypatch.delitem(sys.modules, name)  # an earlier test's package: this one is imported anew
    return tmp_path / "site"
