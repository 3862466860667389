"""The Hugging Face Hub through huggingface_hub: a store in a (private) repository whose
branch is the store's history.

A store URL is ``hf://datasets/OWNER/REPO[@BRANCH][/PREFIX]`` (``hf://models/...`` or
``hf://OWNER/REPO`` for a model repository, as HfFileSystem spells them); key ``k`` is the
file ``PREFIX/k`` on ``BRANCH`` (default ``main``). Every write is one commit. Create-only
and compare-and-swap read the key at the branch's commit and commit with that commit as
``parentCommit``: the Hub refuses the commit (412) when the branch has moved since, so the
check and the write are atomic over the whole branch. Large files go through the client's
LFS path (preupload, LFS batch, PUT, then a commit naming the LFS object).

Credentials are huggingface_hub's own: ``HF_TOKEN``, else the token saved by ``hf auth
login``; ``HF_ENDPOINT`` selects another Hub. The token goes only into request headers.
"""

from __future__ import annotations

import io
import logging
import os
import re
import secrets
from typing import Any
from urllib.parse import unquote

import blake3

from jupyter_portable.core import hooks
from jupyter_portable.core.errors import ObjectMissing, StoreError, UnsupportedStore, UsageError
from jupyter_portable.store.remote import NEW, PROBE_PREFIX, Refused, RemoteBackend

DEFAULT_ENDPOINT = "https://huggingface.co"
REPO_TYPES = {"datasets": "dataset", "models": "model"}
# A commit that lost its parent is tried again from the new tip this often: each lost
# round means another writer's commit landed, so only a store under constant writes runs out.
MAX_TRIES = 30
_COMMIT_OID = re.compile(r"\A[0-9a-f]{40}\Z")
_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,95}\Z")
_TOKEN_HINT = ("set HF_TOKEN (or run `hf auth login`) to a token that may read and write {repo}, "
               "and check the store URL: hf://datasets/OWNER/REPO[@BRANCH][/PREFIX]")


class _Quiet(logging.Filter):
    """Two notices huggingface_hub logs for what this backend does on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        # bytes go up as a buffer so that they take the LFS path (see _add), not Xet
        return not (text.startswith("Uploading files as a binary IO buffer")
                    or text.startswith("No files have been modified since last commit"))


def parse_url(location: str) -> tuple[str, str, str, str]:
    """``(repo_type, repo_id, branch, prefix)`` of ``hf://`` + ``location``; UsageError naming what is wrong."""
    parts = [p for p in location.split("/") if p]
    repo_type = "model"
    if parts and parts[0] in REPO_TYPES:
        repo_type = REPO_TYPES[parts.pop(0)]
    elif parts and parts[0] == "spaces":
        raise UsageError("an hf:// store cannot live in a Space (each commit restarts it)",
                         hint="use a dataset repository: hf://datasets/OWNER/REPO")
    if len(parts) < 2:
        raise UsageError(f"hf://{location} does not name a repository",
                         hint="use hf://datasets/OWNER/REPO[@BRANCH][/PREFIX]")
    owner, name = parts[0], parts[1]
    branch = "main"
    if "@" in name:
        name, _, rev = name.partition("@")
        branch = unquote(rev)  # HfFileSystem writes a '/' in a revision as %2F
        if not branch or _COMMIT_OID.match(branch) or any(c in branch for c in " ~^:?*[\\") or ".." in branch:
            raise UsageError(f"hf://{location}: {branch!r} is not a branch name",
                             hint="a store writes commits, so @REVISION must name a branch (default main)")
    for what, value in (("owner", owner), ("repository", name)):
        if not _NAME.match(value):
            raise UsageError(f"hf://{location}: {value!r} is not a valid {what} name",
                             hint="use hf://datasets/OWNER/REPO[@BRANCH][/PREFIX]")
    return repo_type, f"{owner}/{name}", branch, "/".join(parts[2:])


class HFBackend(RemoteBackend):
    """Files under ``hf://datasets/OWNER/REPO[@BRANCH]/PREFIX``, one commit per write."""

    create_only_condition = "commits with a parent (parentCommit refused when the branch moved)"
    swap_condition = create_only_condition

    def __init__(self, location: str) -> None:
        from huggingface_hub import HfApi, get_token  # heavy: only when an hf:// store is used
        from huggingface_hub.utils import logging as hf_logging

        self.repo_type, self.repo_id, self.branch, self.prefix = parse_url(location)
        kind = "models/" if self.repo_type == "model" else "datasets/"
        rev = "" if self.branch == "main" else "@" + self.branch.replace("/", "%2F")
        self.url = f"hf://{kind}{self.repo_id}{rev}" + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint = (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        # Resolved once here, only to keep it out of every message built below.
        self._token = get_token() or ""
        self.api = HfApi(endpoint=self.endpoint, library_name="jupyter-portable")
        for name in ("huggingface_hub._commit_api", "huggingface_hub.hf_api"):
            logger = hf_logging.get_logger(name)
            if not any(isinstance(f, _Quiet) for f in logger.filters):
                logger.addFilter(_Quiet())

    # -- errors -------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text

    def _fail(self, what: str, key: str, exc: BaseException) -> StoreError:
        from huggingface_hub.errors import (
            HfHubHTTPError,
            RemoteEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        hint = _TOKEN_HINT.format(repo=self.repo_id)
        if isinstance(exc, RemoteEntryNotFoundError):
            return ObjectMissing(f"object {key} is missing from {self.url}", key=key)
        if isinstance(exc, RevisionNotFoundError):
            return StoreError(f"{self.url}: the repository has no branch {self.branch!r}",
                              hint=f"create it (`hf repo branch create {self.repo_id} {self.branch} "
                                   f"--repo-type {self.repo_type}`) or name another with @BRANCH")
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if isinstance(exc, RepositoryNotFoundError) or status == 401:
            return StoreError(f"cannot {what} {key}: {self.url} does not exist, or is private and the token "
                              "cannot read it", hint=hint)
        if status == 403:
            return StoreError(f"access denied to {key} in {self.url}: the token may not write there", hint=hint)
        if status == 429:
            return StoreError(f"the Hub refused to {what} {key} in {self.url}: too many requests (429)",
                              hint="wait a few minutes and run the same command again")
        if isinstance(exc, HfHubHTTPError):
            return StoreError(f"cannot {what} {key} in {self.url}: HTTP {status}: {self._server_says(exc)}")
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        return StoreError(self._scrub(f"cannot {what} {key} in {self.url}: {type(exc).__name__}: {first}"),
                          hint=f"check that {self.endpoint} can be reached (HF_ENDPOINT)")

    def _server_says(self, exc: Any) -> str:
        try:
            body = exc.response.json()
            text = body.get("error") if isinstance(body, dict) else None
        except Exception:  # noqa: BLE001 - a body that is not JSON says nothing more
            text = None
        return self._scrub(str(text or exc.response.reason_phrase or "")[:200])

    @staticmethod
    def _status(exc: BaseException) -> int | None:
        return getattr(getattr(exc, "response", None), "status_code", None)

    # -- reading ------------------------------------------------------------------------

    def _path(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _get(self, key: str, revision: str, headers: dict[str, str] | None = None) -> Any:
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_backoff

        url = hf_hub_url(self.repo_id, self._path(key), repo_type=self.repo_type, revision=revision,
                         endpoint=self.endpoint)
        # A large file's answer is a redirect to storage elsewhere, which gets no Authorization.
        resp = http_backoff("GET", url, headers={**build_hf_headers(library_name="jupyter-portable"),
                                                 **(headers or {})}, follow_redirects=True)
        if resp.status_code == 416:
            return resp
        hf_raise_for_status(resp)
        return resp

    def _fetch(self, key: str, revision: str) -> bytes | None:
        from huggingface_hub.errors import RemoteEntryNotFoundError

        try:
            return bytes(self._get(key, revision).content)
        except RemoteEntryNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - translated at the boundary
            raise self._fail("read", key, exc) from exc

    def read(self, key: str) -> bytes:
        data = self._fetch(key, self.branch)
        if data is None:
            raise ObjectMissing(f"object {key} is missing from {self.url}", key=key)
        return data

    def read_range(self, key: str, start: int, end: int) -> bytes:
        if end <= start:
            if not self.exists(key):
                raise ObjectMissing(f"object {key} is missing from {self.url}", key=key)
            return b""
        try:
            resp = self._get(key, self.branch, {"Range": f"bytes={start}-{end - 1}"})
        except Exception as exc:  # noqa: BLE001
            raise self._fail("read", key, exc) from exc
        if resp.status_code == 416:
            return b""  # a range past the end, as a file read gives
        body = bytes(resp.content)
        return body[start:end] if resp.status_code == 200 else body[: end - start]

    def _info(self, key: str) -> Any:
        try:
            found = self.api.get_paths_info(self.repo_id, [self._path(key)], repo_type=self.repo_type,
                                            revision=self.branch)
        except Exception as exc:  # noqa: BLE001
            raise self._fail("stat", key, exc) from exc
        files = [f for f in found if hasattr(f, "blob_id") and f.path == self._path(key)]
        return files[0] if files else None

    def exists(self, key: str) -> bool:
        return self._info(key) is not None

    def size(self, key: str) -> int:
        info = self._info(key)
        if info is None:
            raise ObjectMissing(f"object {key} is missing from {self.url}", key=key)
        return int(info.size)

    def list(self, prefix: str) -> list[str]:
        from huggingface_hub.errors import RemoteEntryNotFoundError

        base = self._path(prefix).rstrip("/")
        cut = len(self.prefix) + 1 if self.prefix else 0
        try:
            entries = list(self.api.list_repo_tree(self.repo_id, base, recursive=True, repo_type=self.repo_type,
                                                   revision=self.branch))
        except RemoteEntryNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001
            raise self._fail("list", prefix, exc) from exc
        return sorted(e.path[cut:] for e in entries if hasattr(e, "blob_id") and e.path.startswith(base + "/"))

    def read_versioned(self, key: str) -> tuple[bytes, str] | None:
        # The token is the bytes' own hash: a swap compares it with the key at the commit it builds on.
        data = self._fetch(key, self.branch)
        return None if data is None else (data, blake3.blake3(data).hexdigest())

    def tip(self) -> str:
        """The commit the store's branch points at now."""
        try:
            refs = self.api.list_repo_refs(self.repo_id, repo_type=self.repo_type)
        except Exception as exc:  # noqa: BLE001
            raise self._fail("read the branch of", "the store", exc) from exc
        for ref in refs.branches:
            if ref.name == self.branch:
                return str(ref.target_commit)
        raise StoreError(f"{self.url}: the repository has no branch {self.branch!r}",
                         hint=f"create it (`hf repo branch create {self.repo_id} {self.branch} "
                              f"--repo-type {self.repo_type}`) or name another with @BRANCH")

    # -- writing ------------------------------------------------------------------------

    def _commit(self, key: str, data: bytes | None, message: str, parent: str | None) -> None:
        """One commit adding ``key`` (or deleting it, ``data`` None). Raises the client's error as it is."""
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        if data is None:
            self.api.create_commit(self.repo_id, [CommitOperationDelete(self._path(key))], commit_message=message,
                                   repo_type=self.repo_type, revision=self.branch, parent_commit=parent)
            return
        # A buffer, not bytes: huggingface_hub sends bytes through Xet when hf_xet is installed;
        # a buffer takes the Hub's LFS path (preupload, LFS batch, PUT or multipart), which
        # every Hub repository accepts and which the tests' Hub twin serves.
        op = CommitOperationAdd(self._path(key), io.BytesIO(data))
        self.api.preupload_lfs_files(self.repo_id, [op], repo_type=self.repo_type, revision=self.branch,
                                     free_memory=False)
        hooks.step(f"uploaded {key}")  # the LFS object is stored; no commit names it yet
        self.api.create_commit(self.repo_id, [op], commit_message=message, repo_type=self.repo_type,
                               revision=self.branch, parent_commit=parent)

    def _put(self, key: str, data: bytes, cond: str | None) -> None:
        for _ in range(MAX_TRIES):
            parent = None
            if cond is not None:
                parent = self.tip()
                current = self._fetch(key, parent)  # at that commit: immutable, whatever happens next
                if cond == NEW:
                    if current is not None:
                        raise Refused("the key exists")
                elif current is None or blake3.blake3(current).hexdigest() != cond:
                    raise Refused("the key changed")
            try:
                self._commit(key, data, f"{'create' if cond == NEW else 'swap' if cond else 'put'} {key}", parent)
                return
            except Exception as exc:  # noqa: BLE001
                # 412 "A commit has happened since": another commit landed on the branch first.
                # Without a parent the Hub can answer the same to commits that race; either
                # way, look again from the new tip.
                if self._status(exc) in (409, 412):
                    continue
                raise self._fail("write", key, exc) from exc
        raise StoreError(f"cannot write {key} to {self.url}: the branch moved under every one of "
                         f"{MAX_TRIES} tries", hint="other writers keep committing: run the same command again")

    def delete(self, key: str) -> None:
        from huggingface_hub.errors import RemoteEntryNotFoundError

        try:
            self._commit(key, None, f"delete {key}", None)
        except RemoteEntryNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001
            raise self._fail("delete", key, exc) from exc

    def check_conditional_writes(self) -> None:
        """Prove once that the Hub refuses a commit whose parent is no longer the branch's tip
        (both conditions rest on it); :class:`UnsupportedStore` otherwise."""
        if self._probed:
            return
        key = f"{PROBE_PREFIX}/{secrets.token_hex(8)}"
        hint = "use huggingface.co (or a Hub that implements parentCommit), or a file:// store"
        try:
            before = self.tip()
            try:
                self._commit(key, b"probe 1", f"probe {key}", before)
            except Exception as exc:  # noqa: BLE001
                if self._status(exc) not in (409, 412):
                    raise self._fail("write", key, exc) from exc
                # another writer committed in between: not what is being proven; the stale-parent
                # commit below still must fail
                self._commit(key, b"probe 1", f"probe {key}", None)
            try:
                self._commit(key, b"probe 2", f"probe {key}", before)
            except Exception as exc:  # noqa: BLE001
                if self._status(exc) not in (409, 412):
                    raise self._fail("write", key, exc) from exc
            else:
                raise UnsupportedStore(f"{self.endpoint} ignores parentCommit: a commit based on a stale tip "
                                       "of the branch was accepted, so a lost race could move the head",
                                       hint=hint)
        finally:
            try:
                self.delete(key)
            except StoreError:
                pass
        self._probed = True


__all__ = ["HFBackend", "parse_url"]
