"""A Hugging Face hub on 127.0.0.1: as much of it as huggingface_hub 2.4's `model_info`,
`snapshot_download` and `hf_hub_download` use, for `HF_ENDPOINT`.

- `GET /api/models/{repo}` and `/api/models/{repo}/revision/{rev}`: the commit sha and the files;
- `GET /api/models/{repo}/tree/{rev}?recursive=...`: the file tree (path, size, oid; no Xet hash);
- `HEAD` and `GET /{repo}/resolve/{rev}/{file}`: X-Repo-Commit, ETag, Content-Length,
  Accept-Ranges; a GET honours `Range: bytes=N-` with a 206;
- a missing repo, revision or file: 404 with X-Error-Code RepoNotFound, RevisionNotFound or
  EntryNotFound (what turns it into huggingface_hub's error); any other path: a bare 404.

No X-Xet-Hash header and no xetHash in the tree, so the client downloads over plain HTTP (hf_xet is
installed). Every request is recorded; a file named in `cut` has its first GET stop after half its
bytes, the connection closed, as a dropped download does.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]]  # commit sha -> {path: content}
    refs: dict[str, str]  # branch or tag -> commit sha

    def commit(self, revision: str) -> str | None:
        return self.refs.get(revision) or (revision if revision in self.commits else None)


@dataclass
class Request:
    method: str
    path: str
    range: str | None


@dataclass
class FakeHub:
    repos: dict[str, Repo]
    cut: set[str] = field(default_factory=set)  # files whose first GET stops half-way
    requests: list[Request] = field(default_factory=list)

    def __enter__(self) -> FakeHub:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_HEAD(self) -> None:
            self.answer(body=False)

        def do_GET(self) -> None:
            self.answer(body=True)

        def reply(
            self, status: int, body: bytes = b"", headers: dict | None = None, send: bool = True
        ) -> None:
            self.send_response(status)
            for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(key, value)
            self.end_headers()
            if send:
                self.wfile.write(body)

        def missing(self, code: str, headers: dict | None = None) -> None:
            self.reply(404, json.dumps({"error": code}).encode(), {"X-Error-Code": code, **(headers or {})})

        def answer(self, body: bool) -> None:
            hub.requests.append(Request(self.command, self.path, self.headers.get("Range")))
            parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
            api = parts[:2] == ["api", "models"]
            repo_parts = parts[2:4] if api else parts[:2]
            rest = parts[4:] if api else parts[2:]
            repo = hub.repos.get("/".join(repo_parts))
            if len(repo_parts) < 2 or not (api or rest[:1] == ["resolve"]):
                return self.reply(404)
            if repo is None:
                return self.missing("RepoNotFound")
            revision = rest[1] if len(rest) > 1 else "main"
            sha = repo.commit(revision)
            if sha is None:
                return self.missing("RevisionNotFound")
            files = repo.commits[sha]
            if api and rest[:1] == ["tree"]:
                tree = [{"type": "file", "path": p, "size": len(b), "oid": oid(b)} for p, b in files.items()]
                return self.reply(200, json.dumps(tree).encode(), {"Content-Type": "application/json"})
            if api:
                info = {"id": "/".join(repo_parts), "sha": sha, "siblings": [{"rfilename": p} for p in files]}
                return self.reply(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
            path = "/".join(rest[2:])
            if path not in files:
                return self.missing("EntryNotFound", {"X-Repo-Commit": sha})
            self.file(sha, path, files[path], body)

        def file(self, sha: str, path: str, data: bytes, body: bool) -> None:
            etag = f'"{hashlib.sha256(data).hexdigest()}"'
            headers = {"X-Repo-Commit": sha, "ETag": etag, "Accept-Ranges": "bytes"}
            asked = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
            if not body:
                return self.reply(200, data, headers, send=False)
            if asked:
                start, end = int(asked[1]), int(asked[2] or len(data) - 1)
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                return self.reply(206, data[start : end + 1], headers)
            if path in hub.cut:  # the first GET stops half-way: full length announced, half sent
                hub.cut.discard(path)
                self.reply(200, data, headers, send=False)
                self.wfile.write(data[: len(data) // 2])
                self.close_connection = True
                return
            self.reply(200, data, headers)

    return Handler


def oid(data: bytes) -> str:
    """A file's git blob id, as the hub's tree gives it."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
