"""A stateful twin of the Hugging Face Hub's HTTP API on loopback, for huggingface_hub's
own request code (pointed here by ``HF_ENDPOINT``). huggingface_hub 2.x talks through
httpx2, which respx does not intercept, so the tests answer on a real socket instead.

It implements the documented endpoints the client uses and nothing else:

- ``GET /api/{type}s/{repo}/refs``: branches and their commits;
- ``GET /api/{type}s/{repo}/revision/{rev}``: the repository's info at a revision (``sha``);
- ``GET /api/{type}s/{repo}/tree/{rev}[/{path}]``: listing, cursor-paginated with a ``Link`` header;
- ``POST /api/{type}s/{repo}/paths-info/{rev}``: the entries of named paths;
- ``GET|HEAD /[{type}s/]{repo}/resolve/{rev}/{path}``: a file, with ``Range``; an LFS file
  redirects to a signed storage URL (``/_storage/...``), as the Hub redirects to its CDN;
- ``POST /api/{type}s/{repo}/preupload/{rev}``: ``regular`` or ``lfs`` per file, with the
  ``oid`` of what the branch already holds;
- ``POST /[{type}s/]{repo}.git/info/lfs/objects/batch``: git-lfs batch API, ``basic`` or
  ``multipart`` (``chunk_size`` and one signed URL per part, then a completion POST),
  and a ``verify`` action;
- ``POST /api/{type}s/{repo}/commit/{rev}``: the ndjson commit; a ``parentCommit`` that
  is not the branch's tip is ``412 {"error": "A commit has happened since. Please refresh
  and try again."}``, as the Hub answers.

Private repositories need ``Authorization: Bearer <token>``: none is a 401 answered as
"repository not found" (``X-Error-Code: RepoNotFound``), a wrong one is 401 "Invalid
credentials in Authorization header", a read-only token writing is 403. Every request is
recorded as ``(method, path, authorized)`` for the tests; headers and bodies are not kept.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

COMMIT_RACED = "A commit has happened since. Please refresh and try again."
TYPES = {"datasets": "dataset", "models": "model", "spaces": "space"}


def git_blob_id(data: bytes) -> str:
    """git's object id of a blob: what the Hub reports as a regular file's ``oid``."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Entry:
    size: int
    blob_id: str  # git blob id of the bytes (regular) or of the LFS pointer (lfs)
    sha256: str | None = None  # set for an LFS file

    def to_json(self, path: str) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "file", "oid": self.blob_id, "size": self.size, "path": path}
        if self.sha256:
            out["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return out


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, tuple[str | None, dict[str, Entry], str]] = field(default_factory=dict)  # parent, tree, title
    blobs: dict[str, bytes] = field(default_factory=dict)  # regular files by blob id


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class HubTwin:
    """The Hub's state and its HTTP server; ``url`` is what ``HF_ENDPOINT`` points at."""

    def __init__(self, *, token: str, read_token: str | None = None, lfs_threshold: int = 1024 * 1024,
                 chunk_size: int = 16 * 1024 * 1024, page_size: int = 25) -> None:
        self.token, self.read_token = token, read_token
        self.lfs_threshold, self.chunk_size, self.page_size = lfs_threshold, chunk_size, page_size
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lfs: dict[str, bytes] = {}  # LFS storage by sha256
        self.parts: dict[tuple[str, int], bytes] = {}
        self.signed: dict[str, tuple[str, int]] = {}  # upload signature -> (oid, size)
        self.lock = threading.RLock()
        self.requests: list[tuple[str, str, bool]] = []
        # Faults: called with (repo, branch) just before a commit is checked, to land another
        # writer's commit first; and how many applied commits get no answer (a dropped reply).
        self.before_commit: Callable[[Repo, str], None] | None = None
        self.drop_commit_answers = 0
        self.honour_parent = True  # False: a Hub that ignores parentCommit (a broken mirror)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- state -------------------------------------------------------------------------

    def create_repo(self, repo_id: str, *, repo_type: str = "dataset", private: bool = True) -> Repo:
        """A repository with the Hub's first commit (a ``.gitattributes``) on ``main``."""
        with self.lock:
            repo = Repo(repo_type, repo_id, private)
            self.repos[(repo_type, repo_id)] = repo
            attrs = b"*.bin filter=lfs diff=lfs merge=lfs -text\n"
            repo.blobs[git_blob_id(attrs)] = attrs
            self._new_commit(repo, "main", None, {".gitattributes": Entry(len(attrs), git_blob_id(attrs))},
                             "initial commit")
            return repo

    def clone_repo(self, source: Repo, repo_id: str) -> Repo:
        """A copy of ``source`` under another id, sharing its (immutable) history and LFS objects."""
        with self.lock:
            repo = Repo(source.repo_type, repo_id, source.private, dict(source.branches), dict(source.commits),
                        dict(source.blobs))
            self.repos[(source.repo_type, repo_id)] = repo
            return repo

    def _new_commit(self, repo: Repo, branch: str, parent: str | None, tree: dict[str, Entry], title: str) -> str:
        sha = hashlib.sha1(f"{parent}\n{title}\n{secrets.token_hex(8)}".encode()).hexdigest()
        repo.commits[sha] = (parent, tree, title)
        repo.branches[branch] = sha
        return sha

    def commit_file(self, repo: Repo, branch: str, path: str, data: bytes, title: str = "another writer") -> str:
        """Commit one small file as another writer would (tests move a branch with it)."""
        with self.lock:
            tree = dict(repo.commits[repo.branches[branch]][1])
            repo.blobs[git_blob_id(data)] = data
            tree[path] = Entry(len(data), git_blob_id(data))
            return self._new_commit(repo, branch, repo.branches[branch], tree, title)

    def history(self, repo: Repo, branch: str = "main") -> list[tuple[str, str | None, str]]:
        """``(commit, parent, title)`` from the tip back to the first commit."""
        out, sha = [], repo.branches[branch]
        while sha is not None:
            parent, _tree, title = repo.commits[sha]
            out.append((sha, parent, title))
            sha = parent  # type: ignore[assignment]
        return out

    def tree(self, repo: Repo, rev: str) -> dict[str, Entry]:
        sha = repo.branches.get(rev, rev)
        if sha not in repo.commits:
            raise HubError(404, "Revision Not Found", "RevisionNotFound")
        return repo.commits[sha][1]

    def content(self, repo: Repo, entry: Entry) -> bytes:
        return self.lfs[entry.sha256] if entry.sha256 else repo.blobs[entry.blob_id]


def _pointer(sha: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n".encode()


def _handler(hub: HubTwin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # the head and body are two writes: no 40 ms wait for an ACK

        def log_message(self, *args: object) -> None:
            pass

        # -- plumbing ------------------------------------------------------------------

        def _body(self) -> bytes:
            if getattr(self, "_read", None) is not None:
                return self._read
            self._read: bytes | None = self._read_body()
            return self._read

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
            self._send(status, json.dumps(obj).encode(), headers)

        def _error(self, err: HubError) -> None:
            headers = {"X-Error-Message": err.message}
            if err.code:
                headers["X-Error-Code"] = err.code
            self._json({"error": err.message}, err.status, headers)

        def _auth(self) -> str | None:
            """"write", "read" or None (no token); HubError for a token the Hub does not know."""
            value = self.headers.get("Authorization")
            if not value:
                return None
            token = value.removeprefix("Bearer ").strip()
            if token == hub.token:
                return "write"
            if hub.read_token and token == hub.read_token:
                return "read"
            raise HubError(401, "Invalid credentials in Authorization header")

        def _repo(self, repo_type: str, repo_id: str, *, write: bool = False) -> Repo:
            access = self._auth()
            repo = hub.repos.get((repo_type, repo_id))
            if repo is None or (repo.private and access is None):
                raise HubError(401, "Repository not found", "RepoNotFound")
            if write and access is None:
                raise HubError(401, "You must be authenticated to write", None)
            if write and access != "write":
                raise HubError(403, "You don't have the rights to write to this repository", None)
            return repo

        def _dispatch(self) -> None:
            self._read = None
            split = urlsplit(self.path)
            segs = [unquote(s) for s in split.path.split("/")[1:]]
            query = parse_qs(split.query)
            authorized = bool(self.headers.get("Authorization"))
            with hub.lock:
                hub.requests.append((self.command, split.path, authorized))
            try:
                if segs[0] == "_storage":
                    return self._storage(segs[1:], query)
                if segs[0] == "api" and len(segs) >= 5 and segs[1] in TYPES:
                    return self._api(TYPES[segs[1]], f"{segs[2]}/{segs[3]}", segs[4], segs[5:], query)
                repo_type = "model"
                if segs[0] in TYPES:
                    repo_type, segs = TYPES[segs[0]], segs[1:]
                if len(segs) >= 3 and segs[1].endswith(".git") and segs[2:] == ["info", "lfs", "objects", "batch"]:
                    return self._lfs_batch(repo_type, f"{segs[0]}/{segs[1][:-4]}")
                if len(segs) >= 5 and segs[2] == "resolve":
                    return self._resolve(repo_type, f"{segs[0]}/{segs[1]}", segs[3], "/".join(segs[4:]))
                raise HubError(404, f"no such endpoint: {self.command} {split.path}")
            except HubError as err:
                self._body()
                self._error(err)

        do_GET = do_POST = do_PUT = do_HEAD = _dispatch  # noqa: N815

        # -- /api ----------------------------------------------------------------------

        def _api(self, repo_type: str, repo_id: str, verb: str, rest: list[str], query: dict[str, list[str]]) -> None:
            if verb == "refs" and self.command == "GET":
                repo = self._repo(repo_type, repo_id)
                with hub.lock:
                    branches = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": sha}
                                for b, sha in sorted(repo.branches.items())]
                return self._json({"branches": branches, "converts": [], "tags": []})
            if verb == "revision" and self.command == "GET" and rest:  # repo_info at a revision
                repo = self._repo(repo_type, repo_id)
                with hub.lock:
                    tree = hub.tree(repo, rest[0])
                    sha = repo.branches.get(rest[0], rest[0])
                return self._json({"id": repo.repo_id, "sha": sha, "private": repo.private,
                                   "siblings": [{"rfilename": p} for p in sorted(tree)]})
            if verb == "tree" and self.command == "GET" and rest:
                return self._tree(self._repo(repo_type, repo_id), rest[0], "/".join(rest[1:]), query)
            if verb == "paths-info" and self.command == "POST" and rest:
                repo = self._repo(repo_type, repo_id)
                form = parse_qs(self._body().decode())
                with hub.lock:
                    tree = hub.tree(repo, rest[0])
                    out = []
                    for path in form.get("paths", []):
                        if path in tree:
                            out.append(tree[path].to_json(path))
                        elif any(p.startswith(path.rstrip("/") + "/") for p in tree):
                            out.append({"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(),
                                        "size": 0, "path": path})
                return self._json(out)
            if verb == "preupload" and self.command == "POST" and rest:
                repo = self._repo(repo_type, repo_id, write=True)
                body = json.loads(self._body())
                with hub.lock:
                    tree = hub.tree(repo, rest[0])
                    files = []
                    for f in body["files"]:
                        if not isinstance(f.get("path"), str) or not isinstance(f.get("size"), int):
                            raise HubError(400, "preupload: each file needs a path and a size")
                        base64.b64decode(f["sample"], validate=True)
                        have = tree.get(f["path"])
                        oid = None if have is None else (have.sha256 or have.blob_id)
                        mode = "lfs" if f["size"] >= hub.lfs_threshold else "regular"
                        files.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
                return self._json({"files": files})
            if verb == "commit" and self.command == "POST" and rest:
                return self._commit(self._repo(repo_type, repo_id, write=True), rest[0])
            raise HubError(404, f"no such endpoint: {self.command} /api/.../{verb}")

        def _tree(self, repo: Repo, rev: str, path: str, query: dict[str, list[str]]) -> None:
            recursive = query.get("recursive", ["false"])[0].lower() in ("true", "1")
            base = path.strip("/")
            with hub.lock:
                tree = hub.tree(repo, rev)
                entries: dict[str, dict[str, Any]] = {}
                for p, e in tree.items():
                    if base and not p.startswith(base + "/"):
                        continue
                    rel = p[len(base) + 1:] if base else p
                    parts = rel.split("/")
                    for depth in range(1, len(parts)):  # the folders on the way
                        if not recursive and depth > 1:
                            break
                        folder = "/".join(([base] if base else []) + parts[:depth])
                        entries[folder] = {"type": "directory", "size": 0, "path": folder,
                                           "oid": hashlib.sha1(folder.encode()).hexdigest()}
                    if recursive or len(parts) == 1:
                        entries[p] = e.to_json(p)
            if base and not entries:
                raise HubError(404, f"{base} does not exist on {rev}", "EntryNotFound")
            ordered = [entries[k] for k in sorted(entries)]
            start = int(query.get("cursor", ["0"])[0])
            page = ordered[start:start + hub.page_size]
            headers = {}
            if start + hub.page_size < len(ordered):
                nxt = f"{hub.url}{urlsplit(self.path).path}?recursive={str(recursive).lower()}" \
                      f"&cursor={start + hub.page_size}"
                headers["Link"] = f'<{nxt}>; rel="next"'
            self._json(page, headers=headers)

        def _commit(self, repo: Repo, branch: str) -> None:
            if self.headers.get("Content-Type", "").split(";")[0] != "application/x-ndjson":
                raise HubError(400, "a commit is application/x-ndjson")
            lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
            if not lines or lines[0].get("key") != "header" or not lines[0]["value"].get("summary"):
                raise HubError(400, "a commit starts with its header, which needs a summary")
            header = lines[0]["value"]
            with hub.lock:
                if branch not in repo.branches:
                    raise HubError(404, "Revision Not Found", "RevisionNotFound")
                if hub.before_commit is not None:
                    hub.before_commit(repo, branch)
                tip = repo.branches[branch]
                parent = header.get("parentCommit")
                if parent is not None and parent != tip and hub.honour_parent:
                    raise HubError(412, COMMIT_RACED)
                tree = dict(repo.commits[tip][1])
                blobs: dict[str, bytes] = {}
                for line in lines[1:]:
                    key, value = line["key"], line["value"]
                    path = value["path"]
                    if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
                        raise HubError(400, f"invalid path {path!r}")
                    if key == "file":
                        if value.get("encoding") != "base64":
                            raise HubError(400, "file content must be base64")
                        data = base64.b64decode(value["content"], validate=True)
                        if len(data) >= hub.lfs_threshold:
                            raise HubError(400, f"{path} is too large for a regular file: upload it with LFS")
                        blobs[git_blob_id(data)] = data
                        tree[path] = Entry(len(data), git_blob_id(data))
                    elif key == "lfsFile":
                        oid, size = value["oid"], value.get("size")
                        if value.get("algo") != "sha256" or oid not in hub.lfs or size != len(hub.lfs[oid]):
                            raise HubError(400, "Your push was rejected because an LFS pointer pointed to a file "
                                                "that does not exist")
                        tree[path] = Entry(size, git_blob_id(_pointer(oid, size)), oid)
                    elif key == "deletedFile":
                        if path not in tree:
                            raise HubError(404, "A file with this name doesn't exist", "EntryNotFound")
                        del tree[path]
                    elif key == "deletedFolder":
                        for p in [p for p in tree if p.startswith(path.rstrip("/") + "/")]:
                            del tree[p]
                    else:
                        raise HubError(400, f"unknown commit operation {key!r}")
                repo.blobs.update(blobs)
                sha = hub._new_commit(repo, branch, tip, tree, header["summary"])
                if hub.drop_commit_answers > 0:
                    hub.drop_commit_answers -= 1
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
            kind = "datasets/" if repo.repo_type == "dataset" else ""
            self._json({"success": True, "commitOid": sha, "commitUrl": f"{hub.url}/{kind}{repo.repo_id}/commit/{sha}",
                        "hookOutput": "", "pullRequestUrl": None})

        # -- files ---------------------------------------------------------------------

        def _resolve(self, repo_type: str, repo_id: str, rev: str, path: str) -> None:
            if self.command not in ("GET", "HEAD"):
                raise HubError(405, "resolve is GET or HEAD")
            repo = self._repo(repo_type, repo_id)
            with hub.lock:
                sha = repo.branches.get(rev, rev)
                entry = hub.tree(repo, rev).get(path)
                if entry is None:
                    raise HubError(404, "Entry not found", "EntryNotFound")
                data = hub.content(repo, entry)
            common = {"X-Repo-Commit": sha, "ETag": f'"{entry.sha256 or entry.blob_id}"'}
            if entry.sha256:  # the Hub answers an LFS file with a redirect to signed storage
                sig = secrets.token_hex(8)
                with hub.lock:
                    hub.signed[sig] = (entry.sha256, entry.size)
                common.update({"Location": f"{hub.url}/_storage/get/{entry.sha256}?sig={sig}",
                               "X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size)})
                return self._send(302, b"", common)
            self._ranged(data, common)

        def _ranged(self, data: bytes, headers: dict[str, str]) -> None:
            rng = self.headers.get("Range")
            if not rng:
                return self._send(200, data, {**headers, "Accept-Ranges": "bytes"}, "application/octet-stream")
            first, _, last = rng.removeprefix("bytes=").partition("-")
            start = int(first)
            end = min(int(last) if last else len(data) - 1, len(data) - 1)
            if start >= len(data):
                return self._send(416, b"", {**headers, "Content-Range": f"bytes */{len(data)}"})
            self._send(206, data[start:end + 1], {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"},
                       "application/octet-stream")

        # -- LFS -----------------------------------------------------------------------

        def _lfs_batch(self, repo_type: str, repo_id: str) -> None:
            if self.command != "POST":
                raise HubError(405, "the LFS batch API is POST")
            self._repo(repo_type, repo_id, write=True)
            body = json.loads(self._body())
            if body.get("operation") != "upload" or body.get("hash_algo", "sha256") != "sha256":
                raise HubError(400, "only sha256 uploads are served")
            chunked = False
            objects = []
            for obj in body["objects"]:
                oid, size = obj["oid"], obj["size"]
                if oid in hub.lfs:
                    objects.append({"oid": oid, "size": size})  # already stored: no actions
                    continue
                sig = secrets.token_hex(8)
                with hub.lock:
                    hub.signed[sig] = (oid, size)
                verify = {"href": f"{hub.url}/_storage/verify/{oid}?sig={sig}"}
                if size > hub.chunk_size and "multipart" in body.get("transfers", []):
                    chunked = True
                    n = -(-size // hub.chunk_size)
                    header = {"chunk_size": str(hub.chunk_size)}
                    header.update({f"{i:05d}": f"{hub.url}/_storage/part/{oid}/{i}?sig={sig}" for i in range(1, n + 1)})
                    upload = {"href": f"{hub.url}/_storage/complete/{oid}?sig={sig}", "header": header}
                else:
                    upload = {"href": f"{hub.url}/_storage/put/{oid}?sig={sig}"}
                objects.append({"oid": oid, "size": size, "authenticated": True,
                                "actions": {"upload": upload, "verify": verify}})
            self._json({"transfer": "multipart" if chunked else "basic", "objects": objects},
                       headers={"Content-Type": "application/vnd.git-lfs+json"})

        def _storage(self, rest: list[str], query: dict[str, list[str]]) -> None:
            """The signed storage URLs: a presigned PUT, parts, completion, verify and GET."""
            verb, oid = rest[0], rest[1]
            with hub.lock:
                signed = hub.signed.get(query.get("sig", [""])[0])
            if signed is None or signed[0] != oid:
                raise HubError(403, "bad signature")
            size = signed[1]
            if verb == "get" and self.command in ("GET", "HEAD"):
                return self._ranged(hub.lfs[oid], {"ETag": f'"{oid}"'})
            body = self._body()
            if verb == "put" and self.command == "PUT":
                return self._store(oid, size, body)
            if verb == "part" and self.command == "PUT":
                with hub.lock:
                    hub.parts[(oid, int(rest[2]))] = body
                return self._send(200, b"", {"ETag": f'"{hashlib.md5(body).hexdigest()}"'})
            if verb == "complete" and self.command == "POST":
                doc = json.loads(body)
                with hub.lock:
                    parts = [hub.parts.pop((oid, p["partNumber"]), None) for p in doc["parts"]]
                    tags = [f'"{hashlib.md5(p).hexdigest()}"' if p is not None else None for p in parts]
                if doc.get("oid") != oid or any(p is None for p in parts) or \
                        tags != [p["etag"] for p in doc["parts"]]:
                    raise HubError(400, "the parts do not match what was uploaded")
                return self._store(oid, size, b"".join(parts))  # type: ignore[arg-type]
            if verb == "verify" and self.command == "POST":
                doc = json.loads(body)
                if doc.get("oid") != oid or oid not in hub.lfs or len(hub.lfs[oid]) != doc.get("size"):
                    raise HubError(404, "object not found")
                return self._json({"ok": True})
            raise HubError(405, f"{self.command} {verb}")

        def _store(self, oid: str, size: int, data: bytes) -> None:
            if len(data) != size or hashlib.sha256(data).hexdigest() != oid:
                raise HubError(400, "the bytes do not hash to the object id")
            with hub.lock:
                hub.lfs[oid] = data
            self._send(200, b"")

    return Handler


def repo_url(repo_id: str, prefix: str = "", *, branch: str = "main") -> str:
    """The store URL of a dataset repository of the twin."""
    rev = "" if branch == "main" else "@" + quote(branch, safe="")
    return f"hf://datasets/{repo_id}{rev}" + (f"/{prefix}" if prefix else "")
