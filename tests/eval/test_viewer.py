"""The tree viewer on a real scripted rollout, rendered by a real headless Chromium.

The policy is the TextCraft expert with one hostile twist: the root's first reply carries markup
that would retitle the page if it ever ran, so the test sees XSS as a browser would.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pytest

import rao_core.stages.common as common
from flows.cli import main
from rao_core.config import ScoringConfig
from rao_core.eval.viewer import (
    DASH,
    page_name,
    render_tree_html,
    sample_tree_ids,
    tree_rows,
    write_tree_sample,
)
from rao_core.policy import Generation, GenerationRequest, Policy
from rao_core.run import Run
from rao_core.scoring import score_round
from rao_core.stages.rollout import roll_out
from tests.conftest import toy_config

PAYLOAD = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
ATTR_PAYLOAD = "\" onmouseover=\"document.title='pwned'\" x=\"<script>document.title='pwned'</script>"
BAR_GREEN = (0x2E, 0x9E, 0x5B)  # --ok in the viewer's CSS: a solved node's timeline bar


class Hostile(Policy):
    """The expert, except that the root's first thought smuggles in a script."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner

    async def generate(self, request: GenerationRequest) -> Generation:
        gen = await self.inner.generate(request)
        if request.node.depth == 0 and request.node.turn == 0:
            gen.text = gen.text.replace("<thought>", "<thought>" + PAYLOAD, 1)
        return gen

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """One medium task, G=2, error-free expert: trees that delegate to parallel children. Unscored."""
    cfg = toy_config(
        tmp_path_factory.mktemp("viewer"),
        "rollout.num_tasks=1",
        "rollout.group_size=2",
        "rollout.difficulty=medium",
        "policy.error_rate=0",
    )
    real = common.open_policy

    def hostile_policy(*args, **kwargs):
        policy, tokenizer = real(*args, **kwargs)
        return Hostile(policy), tokenizer

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(common, "open_policy", hostile_policy)
        roll_out(Run(cfg), 0)
    return cfg.run_dir


NODES = "rollouts/round=0/nodes.parquet"


def tree_ids(run_dir: Path) -> list[str]:
    rows = duckdb.execute(
        "SELECT DISTINCT tree_id FROM read_parquet($p) ORDER BY 1", {"p": str(run_dir / NODES)}
    )
    return [r[0] for r in rows.fetchall()]


def first_tree(run_dir: Path) -> str:
    return tree_ids(run_dir)[0]


def scored_copy(run_dir: Path, dest: Path) -> Path:
    """The run with round 0 scored, in a copy: the module's run stays unscored for the other tests."""
    shutil.copytree(run_dir, dest)
    score_round(dest, 0, ScoringConfig())
    return dest


class Elements(HTMLParser):
    """Tags and attributes of a page as a browser serialised it, and the document's title."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.title, self._in_title = "", False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_title = tag == "title"

    def handle_endtag(self, tag):
        self._in_title = False

    def handle_data(self, data):
        if self._in_title:
            self.title += data


def test_rows_are_the_whole_tree_parents_first(run_dir):
    tree = first_tree(run_dir)
    rows = tree_rows(run_dir, tree)
    count = duckdb.execute(
        "SELECT count(*) FROM read_parquet($p) WHERE tree_id = $t", {"p": str(run_dir / NODES), "t": tree}
    ).fetchone()[0]
    assert len(rows) == count > 3 and rows[0]["parent_id"] is None
    seen: dict[str, int] = {}
    for r in rows:
        if r["parent_id"] is not None:
            assert seen[r["parent_id"]] == r["depth"] - 1  # the parent came first, one level up
        seen[r["node_id"]] = r["depth"]
    assert not any(r["scored"] for r in rows) and all(r["advantage"] is None for r in rows)
    kids = [r for r in rows if r["depth"] == 1]
    assert any(
        a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"]
        for a in kids
        for b in kids
        if a is not b
    )
    assert PAYLOAD in rows[0]["transcript"]  # the hostile reply really went through the runtime


def test_scores_show_once_the_round_is_scored(run_dir, tmp_path):
    tree = first_tree(run_dir)
    unscored = tree_rows(run_dir, tree)
    dash_cell = f'<span class="num">{DASH}</span>'
    assert render_tree_html(unscored).count(dash_cell) == 2 * len(unscored)  # reward, advantage
    scored = tree_rows(scored_copy(run_dir, tmp_path / "default"), tree)
    assert all(r["scored"] and r["reward"] is not None and r["advantage"] is not None for r in scored)
    page = render_tree_html(scored)
    assert dash_cell not in page
    assert f'<span class="num">{scored[0]["reward"]:.3f}</span>' in page


def test_cli_show_writes_the_page_and_rejects_unknown_ids(run_dir, tmp_path, capsys):
    tree = first_tree(run_dir)
    out = tmp_path / "page.html"
    assert main(["show", tree, "--run-dir", str(run_dir), "--out", str(out)]) == 0
    assert f"<title>RAO tree {tree}</title>" in out.read_text()
    assert main(["show", tree, "--set", f"runs_dir={run_dir.parent}"]) == 0  # the run of a config
    assert (run_dir / "viewer" / "round=0" / page_name(tree)).is_file()
    assert main(["show", "no/such-tree", "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        "\n" not in err and "'no/such-tree'" in err and 'rao sql "select distinct tree_id from nodes"' in err
    )
    assert main(["show", tree, "--run-dir", str(run_dir), "--round", "5"]) == 2  # right id, wrong round


def test_sample_is_deterministic_and_spread(run_dir, tmp_path):
    assert sample_tree_ids([f"t{i}" for i in range(10)], 3) == ["t0", "t3", "t6"]
    assert sample_tree_ids(["b", "a"], 5) == ["a", "b"] and sample_tree_ids(["a"], 0) == []
    one = write_tree_sample(run_dir, 0, 1, tmp_path / "one")
    again = write_tree_sample(run_dir, 0, 1, tmp_path / "again")
    assert [p.name for p in one] == [p.name for p in again] and len(one) == 1
    assert one[0].read_text() == again[0].read_text()
    every = write_tree_sample(run_dir, 0, 9, tmp_path / "all")
    assert len(every) == len(tree_ids(run_dir)) == 2
    assert write_tree_sample(run_dir, 7, 3, tmp_path / "none") == []


# -- in a browser --------------------------------------------------------------------------------
def chromium(*args: str) -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail(
            "chromium is not installed: run `make test` (it installs it via scripts/ensure_chromium.sh)"
        )
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"]
    done = subprocess.run([exe, *flags, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_page_renders_in_chromium_and_no_model_text_runs(run_dir, tmp_path):
    from PIL import Image  # Pillow ships with the pinned stack (mlflow -> matplotlib)

    tree = first_tree(run_dir)
    rows = tree_rows(scored_copy(run_dir, tmp_path / "default"), tree)
    rows[1]["goal"] = ATTR_PAYLOAD  # model text also lands in attributes (the goal's tooltip)
    rows[1]["finish_message"] = PAYLOAD
    page = tmp_path / "tree.html"
    page.write_text(render_tree_html(rows), encoding="utf-8")
    assert "<script" not in page.read_text() and "<img" not in page.read_text()

    profile = f"--user-data-dir={tmp_path / 'profile'}"
    dom = chromium(profile, "--dump-dom", page.as_uri())
    parsed = Elements(dom)
    assert parsed.title == f"RAO tree {tree}"  # no injected script retitled the page
    assert not [t for t, _ in parsed.tags if t in ("script", "img", "iframe", "object")]
    assert not [a for _, attrs in parsed.tags for a in attrs if a.startswith("on")]
    assert "&lt;script&gt;document.title='pwned'&lt;/script&gt;" in dom  # shown as text instead
    bars = [a for t, a in parsed.tags if t == "span" and (a.get("class") or "").startswith("bar ")]
    assert len(bars) == len(rows) and all(re.search(r"left:[\d.]+%;width:[\d.]+%", b["style"]) for b in bars)
    assert sum(t == "details" for t, _ in parsed.tags) == len(rows)

    png = tmp_path / "tree.png"
    chromium(profile, f"--screenshot={png}", "--window-size=1200,900", page.as_uri())
    img = Image.open(png).convert("RGB")
    assert img.size == (1200, 900)
    counts = {colour: n for n, colour in img.getcolors(1200 * 900)}
    assert len(counts) > 200  # text, badges, bars: not a blank or single-colour page
    assert counts.get((255, 255, 255), 0) < 0.8 * 1200 * 900
    assert counts.get(BAR_GREEN, 0) > 500  # the timeline bars were laid out and painted
