"""Model names that are not folders: a short name a package installs, a .gguf file or a folder
holding one. What a user gets when one is missing or ambiguous: one line naming the fix. (The
conversion itself runs on the real file in the real tier, tests/real/test_smollm2.py.)"""

from __future__ import annotations

import pytest

from rao_core.config import ConfigError
from rao_core.models import locate
from rao_core.models.dtypes import auto_dtype, declared_dtype
from rao_core.run import load_config


def test_a_short_name_whose_package_is_missing_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(locate, "known_file", lambda name: None)
    assert not locate.model_exists("smollm2-135m")
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"runs_dir={tmp_path}", "policy.model=smollm2-135m"])
    assert "make smollm2" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match="make smollm2"):
        locate.local_model("smollm2-135m")


def test_gguf_files_missing_or_ambiguous_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no such .gguf file"):
        load_config(overrides=[f"runs_dir={tmp_path}", f"policy.model={tmp_path / 'm.gguf'}"])
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.gguf").write_bytes(b"GGUF")
    (two / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(FileNotFoundError, match="holds 2 .gguf files"):
        locate.local_model(str(two))


def test_a_folder_with_a_config_is_a_checkpoint_even_beside_a_gguf(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert locate.gguf_source(str(tmp_path)) is None
    assert locate.local_model(str(tmp_path)) == tmp_path


def test_auto_precision_follows_the_device_and_the_checkpoint(tmp_path, monkeypatch):
    bf16, fp32 = tmp_path / "bf16", tmp_path / "fp32"
    for folder, dtype in ((bf16, "bfloat16"), (fp32, "float32")):
        folder.mkdir()
        (folder / "config.json").write_text(f'{{"dtype": "{dtype}"}}')
    assert declared_dtype(bf16) == "bfloat16" and declared_dtype(tmp_path / "none") == "float32"
    monkeypatch.setattr("rao_core.models.dtypes.cpu_has_bf16", lambda: True)
    assert (auto_dtype("cpu", bf16), auto_dtype("cpu", fp32)) == ("bfloat16", "float32")
    assert auto_dtype("cuda", fp32) == "bfloat16"
    monkeypatch.setattr("rao_core.models.dtypes.cpu_has_bf16", lambda: False)
    assert auto_dtype("cpu", bf16) == "float32"  # emulated bf16 is slower than float32
