"""Hub ids that are not cached download on first use, from a fake hub on 127.0.0.1 (fake_hub.py)
serving a tiny Qwen3 at two commits. Each case runs `local_model` or `load_config` in a fresh Python:
huggingface_hub reads HF_ENDPOINT, HF_HUB_CACHE and HF_HUB_OFFLINE at import, and the suite runs
with HF_HUB_OFFLINE=1 (tests/conftest.py), which the child is not given unless asked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.families import FAMILIES, checkpoint
from tests.models.fake_hub import FakeHub, Repo

ROOT = Path(__file__).resolve().parents[2]
REPO, OLD, NEW = "Org/Tiny-Qwen3", "1" * 40, "2" * 40  # main is NEW; the tag v1 is OLD
LOCATE = """
import sys
from rao_core.models.locate import local_model
try:
    print(local_model(sys.argv[1]))
except FileNotFoundError as e:
    sys.exit(f"refused: {e}")
"""
# huggingface_hub writes what it receives in whole 10 MiB chunks; 16 KiB ones let a cut in a tiny
# file land past a chunk, so the retry has bytes to resume from
SMALL_CHUNKS = "import huggingface_hub.constants as c\nc.DOWNLOAD_CHUNK_SIZE = 16384\n" + LOCATE
CHECK = """
import sys
from rao_core.config import ConfigError
from rao_core.run import load_config
try:
    load_config(overrides=[f"runs_dir={sys.argv[2]}", f"policy.model={sys.argv[1]}"])
except ConfigError as e:
    sys.exit(f"refused: {e}")
"""


def files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def commits(tmp_path_factory) -> dict[str, dict[str, bytes]]:
    """The repo's two commits: the second has other weights and a README."""
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    old = files(checkpoint(FAMILIES["qwen3"], folder / "old", seed=0))
    new = files(checkpoint(FAMILIES["qwen3"], folder / "new", seed=1)) | {"README.md": b"# Tiny-Qwen3 v2\n"}
    assert old["model.safetensors"] != new["model.safetensors"]
    return {OLD: old, NEW: new}


@pytest.fixture
def hub(commits):
    with FakeHub({REPO: Repo(commits, refs={"main": NEW, "v1": OLD})}) as hub:
        yield hub


def child(
    hub: FakeHub, tmp_path: Path, code: str, *args: str, offline: bool = False
) -> subprocess.CompletedProcess:
    """`code` in a fresh Python pointed at the fake hub, online unless asked, with the cache under
    tmp_path (empty at first, the same one on each call) and no token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_"))}
    env |= {
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HOME": str(tmp_path / "hf-home"),
    }
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def snapshot_of(tmp_path: Path, sha: str) -> Path:
    return tmp_path / "hub" / "models--Org--Tiny-Qwen3" / "snapshots" / sha


def file_gets(hub: FakeHub) -> list:
    return [r for r in hub.requests if r.method == "GET" and "/resolve/" in r.path]


def test_an_uncached_hub_id_downloads_on_first_use_then_reads_the_cache(hub, commits, tmp_path):
    first = child(hub, tmp_path, LOCATE, REPO)
    assert first.returncode == 0, first.stderr
    assert Path(first.stdout.strip()) == snapshot_of(tmp_path, NEW)
    assert files(snapshot_of(tmp_path, NEW)) == commits[NEW]
    said = f"{REPO!r} is not in the Hugging Face cache: downloading it from {hub.url} into {tmp_path / 'hub'}"
    assert said in first.stderr.splitlines()[0]
    assert f"Fetching {len(commits[NEW])} files: 100%" in first.stderr  # the hub's own progress bar
    assert len(file_gets(hub)) == len(commits[NEW])

    hub.requests.clear()
    second = child(hub, tmp_path, LOCATE, REPO)
    assert second.returncode == 0 and second.stdout == first.stdout and second.stderr == ""
    assert hub.requests == []  # the cache alone: not even a HEAD


def test_a_pinned_revision_gets_that_revisions_files(hub, commits, tmp_path):
    assert child(hub, tmp_path, LOCATE, REPO).returncode == 0  # main (NEW) cached first
    by_sha = child(hub, tmp_path, LOCATE, f"{REPO}@{OLD}")
    assert by_sha.returncode == 0, by_sha.stderr
    assert Path(by_sha.stdout.strip()) == snapshot_of(tmp_path, OLD)
    assert files(snapshot_of(tmp_path, OLD)) == commits[OLD]  # the old weights, no README

    hub.requests.clear()
    by_tag = child(hub, tmp_path, LOCATE, f"{REPO}@v1")
    assert by_tag.returncode == 0 and by_tag.stdout == by_sha.stdout
    assert file_gets(hub) == []  # the tag resolved to OLD on the hub; its files were cached already
    assert files(snapshot_of(tmp_path, NEW)) == commits[NEW]  # main untouched


def test_a_missing_repo_or_revision_is_one_clear_line(hub, tmp_path):
    repo = child(hub, tmp_path, LOCATE, "Org/Missing")
    assert repo.returncode == 1 and repo.stderr.splitlines() == [
        f"refused: 'Org/Missing': no such model on {hub.url} (a private or gated one needs `hf auth login`)"
    ]
    revision = child(hub, tmp_path, LOCATE, f"{REPO}@v9")
    assert revision.returncode == 1 and revision.stderr.splitlines() == [
        f"refused: {REPO!r} has no revision 'v9' on {hub.url} (name a branch, a tag or a commit sha)"
    ]
    assert file_gets(hub) == [] and not (tmp_path / "hub").exists()


def test_an_unreachable_hub_is_one_line_naming_it(tmp_path):
    with FakeHub({}) as gone:
        pass  # its port is closed now
    run = child(gone, tmp_path, LOCATE, REPO)
    assert run.returncode == 1 and run.stderr.splitlines() == [
        f"refused: {REPO!r} is not in the Hugging Face cache ({tmp_path / 'hub'}) and the hub at "
        f"{gone.url} cannot be reached (ConnectError): check the network and HF_ENDPOINT"
    ]


def test_a_download_cut_off_half_way_resumes_byte_identical(hub, commits, tmp_path):
    hub.cut.add("model.safetensors")
    run = child(hub, tmp_path, SMALL_CHUNKS, REPO)
    assert run.returncode == 0, run.stderr
    gets = [r for r in file_gets(hub) if r.path.endswith("/model.safetensors")]
    size = len(commits[NEW]["model.safetensors"])
    assert len(gets) == 2 and gets[0].range is None
    written = size // 2 // 16384 * 16384  # the whole chunks it had written when the connection closed
    assert written > 0 and gets[1].range == f"bytes={written}-"
    assert "Trying to resume download" in run.stderr
    assert files(snapshot_of(tmp_path, NEW)) == commits[NEW]


def test_offline_an_uncached_hub_id_is_refused_naming_hf_download(hub, tmp_path):
    run = child(hub, tmp_path, LOCATE, f"{REPO}@v1", offline=True)
    assert run.returncode == 1 and run.stderr.splitlines() == [
        f"refused: '{REPO}@v1' is not in the Hugging Face cache ({tmp_path / 'hub'}) and HF_HUB_OFFLINE=1 "
        f"forbids downloading it: fetch it first (`hf download {REPO} --revision v1`) or unset HF_HUB_OFFLINE"
    ]
    assert hub.requests == []


def test_the_config_check_accepts_a_hub_id_on_the_hub_and_refuses_a_missing_one(hub, tmp_path):
    ok = child(hub, tmp_path, CHECK, REPO, str(tmp_path / "runs"))
    assert ok.returncode == 0, ok.stderr
    assert file_gets(hub) == [] and not snapshot_of(tmp_path, NEW).exists()  # checked, not downloaded
    missing = child(hub, tmp_path, CHECK, "Org/Missing", str(tmp_path / "runs"))
    assert missing.returncode == 1 and missing.stderr.splitlines() == [
        f"refused: policy.model: 'Org/Missing': no such model on {hub.url} (a private or gated one needs "
        "`hf auth login`)"
    ]
