import pytest

pytest.register_assert_rewrite("tests.real.rounds")  # its asserts print their values, as a test's do
