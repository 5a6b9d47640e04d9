"""Private library internals are used only with the exact version they were tested against."""

import pytest

from rao_core.versions import require_tested


def test_another_version_is_refused_with_what_to_do(monkeypatch):
    monkeypatch.delenv("RAO_ALLOW_UNTESTED_TRL", raising=False)
    with pytest.raises(ImportError, match=r"tested with trl==0\.1\.0 only; found 1\.16\.0\. Install 0\.1\.0"):
        require_tested("trl", "0.1.0", "x", "tests/train/test_loss.py")
    require_tested("trl", "1.16.0", "x", "y")  # the pinned one passes
    monkeypatch.setenv("RAO_ALLOW_UNTESTED_TRL", "1")
    require_tested("trl", "0.1.0", "x", "y")  # an explicit override
