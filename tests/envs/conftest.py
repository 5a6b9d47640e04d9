"""The user's package of the suite-plugin tests (tests/envs/test_suite_plugins.py), for every test here."""

from __future__ import annotations

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
    return tmp_path / "site"
