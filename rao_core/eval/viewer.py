"""The tree viewer: one execution tree as a standalone HTML page (`rao show`, campaign artifacts).

The page is one file with inline CSS and no script at all, so it opens from disk, from an MLflow
artifact view (which sandboxes scripts) or from a mail attachment, with nothing fetched. Its
Content-Security-Policy forbids scripts and network access as a second wall behind escaping:
goals, transcripts and finish messages are model-written text and are treated as hostile.

Rows come from DuckDB (sql/viewer/tree.sql over the run's `nodes` and `scores` views), so the
viewer shows exactly what scoring and training read.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import duckdb

from rao_core.layout import RunLayout
from rao_core.store.db import connect
from rao_core.store.schema import STATUSES
from rao_core.store.sqlfiles import run_sql

DASH = "—"  # shown for a value that does not exist yet (an unscored round has no reward)
LIST_IDS = 'rao sql "select distinct tree_id from nodes"'


def _fetch(con: duckdb.DuckDBPyConnection, tree_id: str, round: int | None) -> list[dict[str, Any]]:
    cur = run_sql(con, "viewer/tree", {"tree_id": tree_id, "round": round})
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _not_found(run_dir: str | Path, tree_id: str, round: int | None) -> ValueError:
    where = f"{run_dir}" + ("" if round is None else f" round {round}")
    return ValueError(f"no tree {tree_id!r} in {where}; list the ids with: {LIST_IDS} --run-dir {run_dir}")


def tree_rows(run_dir: str | Path, tree_id: str, round: int | None = None) -> list[dict[str, Any]]:
    """The nodes of one tree, parents before children (depth-first, siblings in launch order),
    each with its scores columns (`scored` false and reward/advantage None before scoring).
    `round` None: the latest round that holds the tree. Raises ValueError for an unknown id."""
    with connect(run_dir) as con:
        rows = _fetch(con, tree_id, round)
    if not rows:
        raise _not_found(run_dir, tree_id, round)
    return rows


def sample_tree_ids(ids: list[str], n: int) -> list[str]:
    """n ids evenly spaced over the sorted list: deterministic, and spread over the root tasks
    (ids sort by task, then sample) instead of n samples of the first task."""
    ids = sorted(ids)
    if n >= len(ids):
        return ids
    return [ids[i * len(ids) // n] for i in range(max(0, n))]


def page_name(tree_id: str) -> str:
    """A file name for a tree's page: `task/3` -> `task_3.html` (ids hold `/`)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", tree_id).strip(".") + ".html"


def write_tree_sample(run_dir: str | Path, round: int, n: int, out_dir: str | Path) -> list[Path]:
    """Pages for a deterministic sample of n trees of a round (all of them if it has fewer), written
    to out_dir; returns their paths in sample order. An empty or missing round gives []."""
    out_dir = Path(out_dir)
    paths = []
    with connect(run_dir) as con:
        ids = [r[0] for r in run_sql(con, "viewer/tree_ids", {"round": round}).fetchall()]
        for tree_id in sample_tree_ids(ids, n):
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / page_name(tree_id)
            path.write_text(render_tree_html(_fetch(con, tree_id, round)), encoding="utf-8")
            paths.append(path)
    return paths


def show_tree(
    run_dir: str | Path, tree_id: str, round: int | None = None, out: str | Path | None = None
) -> Path:
    """`rao show`: write one tree's page (default `<run>/viewer/round=R/<tree>.html`); returns its path."""
    rows = tree_rows(run_dir, tree_id, round)
    path = Path(out) if out else RunLayout(Path(run_dir)).viewer(rows[0]["round"]) / page_name(tree_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_tree_html(rows), encoding="utf-8")
    return path


# -- rendering ---------------------------------------------------------------------------------
def _e(value: Any) -> str:
    """Every value that reaches the page goes through here: text, never markup."""
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: float | None, fmt: str) -> str:
    return DASH if value is None else format(value + 0.0, fmt)  # + 0.0: no "-0.000"


def _secs(x: float) -> str:
    return f"{x:.2f} s" if x < 60 else f"{int(x // 60)} min {x % 60:04.1f} s"


def _outcome(row: dict[str, Any]) -> str:
    """The bar's colour: solved, partly solved, failed, or ended without finish() (budget, error...)."""
    if row["status"] != "finished":
        return "abort"
    s = row["success"] or 0.0
    return "ok" if s >= 1.0 else "partial" if s > 0.0 else "fail"


def _status_class(status: str | None) -> str:
    return f"s-{status}" if status in STATUSES else "s-other"  # never a model-chosen class name


CSS = """
:root{--line:#e3e6ea;--muted:#667085;--ok:#2e9e5b;--partial:#d9a21b;--fail:#d64545;--abort:#8e5bd6}
*{box-sizing:border-box}
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f7f8fa}
header{padding:16px 24px;background:#1f2a44;color:#fff}
header h1{margin:0 0 8px;font-size:18px;font-weight:600}
header code{background:#2f3d5e;padding:1px 6px;border-radius:4px}
.facts{display:flex;flex-wrap:wrap;gap:6px 18px;margin:0}
.facts div{display:flex;gap:6px}.facts dt{color:#b8c2d8}.facts dd{margin:0;font-weight:600}
.goal{margin:10px 0 0;color:#dbe3f3}
.legend{display:flex;gap:16px;padding:10px 24px;color:var(--muted);font-size:12px}
.legend span[class]::before{content:"";display:inline-block;width:12px;height:12px;border-radius:3px;margin-right:5px;vertical-align:-2px;background:var(--c)}
main{margin:0 24px 24px;background:#fff;border:1px solid var(--line);border-radius:8px;overflow:hidden}
.row{display:grid;grid-template-columns:minmax(18rem,2.6fr) 6.5rem 4.5rem 4.5rem 5.5rem 3.5rem 3.5rem 5rem minmax(14rem,2.4fr);align-items:center;min-height:28px;border-bottom:1px solid var(--line)}
.row>span{padding:3px 8px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.row .num{text-align:right;font-variant-numeric:tabular-nums}
.head>span{padding:3px 6px}
.head{background:#eef1f5;font-weight:600;color:#344054;font-size:12px;position:sticky;top:0;z-index:1}
details.node>summary{list-style:none;cursor:pointer}
details.node>summary::-webkit-details-marker{display:none}
details.node>summary:hover{background:#f3f6fb}
.name{padding-left:calc(var(--d) * 18px + 8px) !important}
.name::before{content:"\\25B8";display:inline-block;width:14px;color:var(--muted)}
details[open]>summary .name::before{content:"\\25BE"}
.path{font-family:ui-monospace,Menlo,Consolas,monospace;color:#475467;margin-right:6px}
.status{font-size:12px}.status b{padding:1px 6px;border-radius:9px;font-weight:600}
.s-finished b{background:#e3f4ea;color:#1f7a44}.s-other b,.s-error b,.s-refused b{background:#fde8e8;color:#a52a2a}
.s-budget b,.s-context_overflow b,.s-loop b,.s-timeout b{background:#fdf1d8;color:#8a5a00}
.timeline{position:relative;height:28px;padding:0 !important;background:repeating-linear-gradient(to right,var(--line) 0 1px,transparent 1px 25%)}
.bar{position:absolute;top:7px;height:14px;min-width:2px;border-radius:3px;background:var(--c)}
.ok{--c:var(--ok)}.partial{--c:var(--partial)}.fail{--c:var(--fail)}.abort{--c:var(--abort)}
.axis{position:relative;height:28px;padding:0 !important}
.tick{position:absolute;top:6px;font-size:11px;color:var(--muted);transform:translateX(-50%)}
.tick:first-child{transform:none}.tick:last-child{transform:translateX(-100%)}
.body{padding:8px 16px 12px calc(var(--d) * 18px + 30px);background:#fbfcfd;border-bottom:1px solid var(--line)}
.body p{margin:4px 0}.body .k{color:var(--muted)}
pre.transcript{margin:8px 0 0;padding:10px;max-height:480px;overflow:auto;white-space:pre-wrap;word-break:break-word;background:#fff;border:1px solid var(--line);border-radius:6px;font:12px/1.45 ui-monospace,Menlo,Consolas,monospace}
footer{margin:0 24px 24px;color:var(--muted);font-size:12px}
"""

COLUMNS = ("node / goal", "status", "success", "reward", "advantage", "depth", "turns", "tokens")


def _axis(span: float) -> str:
    ticks = "".join(
        f'<span class="tick" style="left:{q * 25}%">{_secs(span * q / 4)}</span>' for q in range(5)
    )
    return f'<span class="axis">{ticks}</span>'


def _node(row: dict[str, Any], t0: float, span: float) -> str:
    d = int(row["depth"] or 0)
    path = str(row["node_id"]).rsplit(":", 1)[-1]
    start = (row["started_at"] or t0) - t0
    end = (row["ended_at"] or row["started_at"] or t0) - t0
    left, width = 100 * start / span, 100 * max(0.0, end - start) / span
    prompt, action = row["prompt_tokens"] or 0, row["action_tokens"] or 0
    advantage = _num(row["advantage"], "+.3f")
    if row["scored"] and not row["trained"] and row["drop_reason"]:
        advantage += "*"  # a dropped tree: the footnote below says the trainer skips it
    timing = f"{_secs(start)} to {_secs(end)} ({_secs(end - start)})"
    cells = [
        f'<span class="name" style="--d:{d}" title="{_e(row["goal"])}">'
        f'<span class="path">{_e(path)}</span>{_e(row["goal"])}</span>',
        f'<span class="status {_status_class(row["status"])}"><b>{_e(row["status"])}</b></span>',
        f'<span class="num">{_num(row["success"], ".2f")}</span>',
        f'<span class="num">{_num(row["reward"], ".3f")}</span>',
        f'<span class="num">{advantage}</span>',
        f'<span class="num">{d}</span>',
        f'<span class="num">{_e(row["turns"])}</span>',
        f'<span class="num" title="prompt {prompt:,} + generated {action:,}">{prompt + action:,}</span>',
        f'<span class="timeline"><span class="bar {_outcome(row)}" '
        f'style="left:{left:.3f}%;width:{width:.3f}%" title="{_e(timing)}"></span></span>',
    ]
    facts = [
        ("finish message", row["finish_message"]),
        ("targets", row["targets"]),
        ("time", timing),
        ("children", f"{row['children']} started, {row['refused_launches']} refused"),
        ("tokens", f"{prompt:,} prompt + {action:,} generated"),
    ]
    if row["scored"]:
        facts.append(("baseline", _num(row["baseline"], ".3f")))
        facts.append(("trained", "yes" if row["trained"] else f"no ({row['drop_reason'] or 'not trained'})"))
    body = "".join(f'<p><span class="k">{_e(k)}:</span> {_e(v)}</p>' for k, v in facts)
    return (
        f'<details class="node" id="node-{_e(path)}"><summary class="row">{"".join(cells)}</summary>'
        f'<div class="body" style="--d:{d}">{body}'
        f'<pre class="transcript">{_e(row["transcript"])}</pre></div></details>'
    )


def render_tree_html(rows: list[dict[str, Any]]) -> str:
    """One tree (rows as `tree_rows` returns them: parents first) as a standalone HTML page."""
    if not rows:
        raise ValueError("a tree page needs at least one node")
    root = next((r for r in rows if r["parent_id"] is None), rows[0])
    t0 = root["started_at"] or min(r["started_at"] or 0.0 for r in rows)
    span = max(1e-6, max((r["ended_at"] or t0) for r in rows) - t0)
    scored = all(r["scored"] for r in rows)
    facts = [
        ("run", root["run"]),
        ("round", root["round"]),
        ("task", root["task_id"]),
        ("difficulty", root["difficulty"]),
        ("mode", root["mode"]),
        ("policy version", root["policy_version"]),
        ("nodes", len(rows)),
        ("max depth", max(int(r["depth"] or 0) for r in rows)),
        ("wall time", _secs(span)),
        ("root success", _num(root["success"], ".2f")),
        ("root status", root["status"]),
        ("tree status", root["tree_status"]),
        ("scored", "yes" if scored else "no (reward and advantage show " + DASH + ")"),
    ]
    facts_html = "".join(f"<div><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>" for k, v in facts)
    head = "".join(f'<span class="{"num" * (i > 1)}">{_e(c)}</span>' for i, c in enumerate(COLUMNS))
    legend = (
        '<span class="ok">solved</span><span class="partial">partly solved</span>'
        '<span class="fail">failed</span><span class="abort">ended without finish()</span>'
        "<span>bars: start to end, relative to the root's start; click a row for its transcript</span>"
    )
    dropped = any(r["scored"] and not r["trained"] and r["drop_reason"] for r in rows)
    note = " * advantage of a tree the trainer drops (see each node's trained line)." if dropped else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\">"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>RAO tree {_e(root['tree_id'])}</title><style>{CSS}</style></head><body>"
        f"<header><h1>Tree <code>{_e(root['tree_id'])}</code></h1>"
        f'<dl class="facts">{facts_html}</dl><p class="goal">{_e(root["goal"])}</p></header>'
        f'<div class="legend">{legend}</div>'
        f'<main><div class="row head">{head}{_axis(span)}</div>'
        + "".join(_node(r, t0, span) for r in rows)
        + f"</main><footer>RAO tree viewer (rao show).{_e(note)}</footer></body></html>\n"
    )
