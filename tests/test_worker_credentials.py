"""Store credentials on rented machines: an ``s3://`` store's worker gets STS session
credentials scoped to its workspace (never the user's keys), refreshed through the worker's
API; no worker or kernel environment holds a long-lived AWS key or a provider key.

The moto server enforces IAM here. What AWS does that moto does not is added for the
duration of a test (``iam_enforced``): an assumed role's session policy limits what the
role allows (moto applies only the role's own policies); a condition is evaluated on the
request's keys as AWS does (``s3:prefix`` of a ListBucket, ``s3:if-none-match`` and
``s3:if-match`` from a PutObject's headers; ``StringLike`` and ``Null``; a key the request
lacks fails every operator but ``Null``), where moto skips keys it lacks and operators it
does not know; and an Allow whose condition is not met does not apply, where moto makes it a
Deny. Everything else is moto's own evaluation of the policy this package writes.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from conftest import make_bucket
from jupyter_e2e import portable_env, release_all

pytestmark = pytest.mark.timeout(300)

ACCOUNT = "123456789012"
PROVIDER_KEYS = {"RUNPOD_API_KEY": "rp-secret-1", "VAST_API_KEY": "vast-secret-2", "LAMBDA_API_KEY": "lam-secret-3",
                 "GOOGLE_APPLICATION_CREDENTIALS": "/home/user/gcp-key.json"}


def _string_like(expected: Any, actual: str) -> bool:
    patterns = [expected] if isinstance(expected, str) else list(expected)
    return any(fnmatch.fnmatchcase(actual, p) for p in patterns)


def _conditions_as_aws(statement: Any, context: dict[str, str] | None) -> bool:
    """Whether a statement's Condition block holds for a request's ``context`` (IAM's rules)."""
    from moto.iam.policy_conditions import CONDITION_OPERATIONS

    context = context or {}
    for operator, keys in statement._statement.get("Condition", {}).items():
        for key, expected in keys.items():
            if operator == "Null":
                if (key not in context) != (str(expected).lower() == "true"):
                    return False
            elif key not in context or not CONDITION_OPERATIONS[operator](expected, context[key]):
                return False  # an operator this fixture does not know raises KeyError: the test stops
    return True


def _request_context(request: Any) -> dict[str, str]:
    """The condition keys of one S3 request that the policies here use."""
    headers = {str(k).lower(): str(v) for k, v in request._headers.items()}
    context = {"s3:prefix": parse_qs(urlparse(request._path).query).get("prefix", [""])[0]}
    for header in ("if-none-match", "if-match"):
        if header in headers:
            context[f"s3:{header}"] = headers[header]
    return context


@pytest.fixture
def iam_enforced(aws_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A bucket, an IAM user with the user's long-lived keys (in the environment), a role for
    workers that the user may assume, and moto enforcing IAM from then on."""
    import boto3
    from moto.core.authorization import enable_iam_authentication
    from moto.iam import access_control, policy_conditions
    from moto.sts.models import sts_backends

    bucket = make_bucket()
    iam = boto3.client("iam")
    user = f"researcher-{bucket[-6:]}"
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*", "sts:*"], "Resource": "*"}]}))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    role = f"portable-worker-{bucket[-6:]}"
    role_arn = iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:user/{user}"}}]}),
                               )["Role"]["Arn"]
    iam.put_role_policy(RoleName=role, PolicyName="bucket", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*",
                                                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]}))

    original = access_control.IAMRequestBase.check_action_permitted
    statement_verdict = access_control.IAMPolicyStatement.is_action_permitted

    evaluated: list[tuple[str, str, dict[str, str]]] = []  # (IAM action, resource, context) of each S3 request

    def with_session_policy(self: Any, resource: str) -> None:
        if isinstance(self, access_control.S3IAMRequest):
            evaluated.append((self._action, resource, _request_context(self)))
        original(self, resource)
        if not isinstance(self._access_key, access_control.AssumedRoleAccessKey):
            return
        session = next(r for r in sts_backends[ACCOUNT]["aws"].assumed_roles
                       if r.access_key_id == self._access_key._access_key_id)
        if session.policy:
            verdict = access_control.IAMPolicy(session.policy).is_action_permitted(
                self._action, resource, None, _request_context(self))
            if verdict != access_control.PermissionResult.PERMITTED:
                self._raise_access_denied()

    def allow_never_denies(self: Any, *args: Any, **kwargs: Any) -> Any:
        verdict = statement_verdict(self, *args, **kwargs)
        if verdict == access_control.PermissionResult.DENIED and self._statement.get("Effect") == "Allow":
            return access_control.PermissionResult.NEUTRAL
        return verdict

    monkeypatch.setattr(access_control.IAMRequestBase, "check_action_permitted", with_session_policy)
    monkeypatch.setattr(access_control.IAMPolicyStatement, "_check_conditions", _conditions_as_aws)
    monkeypatch.setattr(access_control.IAMPolicyStatement, "is_action_permitted", allow_never_denies)
    monkeypatch.setitem(policy_conditions.CONDITION_OPERATIONS, "StringLike", _string_like)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
    monkeypatch.setenv("JUPYTER_PORTABLE_S3_ROLE_ARN", role_arn)
    with enable_iam_authentication():
        yield {"bucket": bucket, "key_id": key["AccessKeyId"], "secret": key["SecretAccessKey"],
               "role_arn": role_arn, "evaluated": evaluated}  # type: ignore[dict-item]


def _two_workspaces(tmp_path: Path, url: str) -> tuple[Any, Any]:
    from jupyter_portable import Workspace

    out = []
    for name in ("a", "b"):
        root = tmp_path / name
        root.mkdir()
        (root / "notes.txt").write_text(f"workspace {name}\n")
        ws = Workspace.init(root, url)
        ws.snapshot("first", progress=None)
        out.append(ws)
    return out[0], out[1]


def _s3_with(creds: Any) -> Any:
    import boto3

    return boto3.client("s3", aws_access_key_id=creds.access_key_id, aws_secret_access_key=creds.secret_access_key,
                        aws_session_token=creds.session_token)


def _denied(call: Any) -> bool:
    from botocore.exceptions import ClientError

    try:
        call()
    except ClientError as exc:
        return exc.response["Error"]["Code"] in ("AccessDenied", "403")
    return False


def test_the_workers_list_request_is_evaluated_as_s3_list_bucket_with_its_prefix(iam_enforced: dict[str, Any],
                                                                                tmp_path: Path) -> None:
    """Issue 39: the request the worker makes to list its own manifests (``ListObjectsV2`` with a
    prefix inside its workspace, as ``Store.versions`` sends it) is allowed by its session policy.
    AWS authorizes ListObjectsV2 as the IAM action ``s3:ListBucket`` on the bucket, with the
    request's ``prefix`` as ``s3:prefix`` (the S3 User Guide's actions table); the policy allows
    exactly that. moto 5.2.6 evaluates it as ``s3:ListObjectsV2``, an action no IAM policy can
    name, and denies it: that release is kept out of the lock (docs/development.md)."""
    from botocore.exceptions import ClientError

    from jupyter_portable.store.credentials import issue

    bucket = iam_enforced["bucket"]
    url = f"s3://{bucket}/team"
    a, _b = _two_workspaces(tmp_path, url)
    creds = issue(url, a.workspace_id, session_name="al-list")
    assert creds is not None
    prefix = f"team/workspaces/{a.workspace_id}/manifests/"
    iam_enforced["evaluated"].clear()
    try:
        listed = _s3_with(creds).list_objects_v2(Bucket=bucket, Prefix=prefix)
    except ClientError as exc:
        raise AssertionError(f"ListObjectsV2 Prefix={prefix} was refused ({exc}); the server evaluated "
                             f"{iam_enforced['evaluated']}, where AWS evaluates s3:ListBucket on "
                             f"arn:aws:s3:::{bucket} with s3:prefix {prefix!r}") from None
    assert [k["Key"].rsplit("/", 1)[0] + "/" for k in listed["Contents"]] == [prefix]
    action, resource, context = iam_enforced["evaluated"][-1]
    assert (action, resource, context["s3:prefix"]) == ("s3:ListBucket", f"arn:aws:s3:::{bucket}", prefix), (
        "the S3 server must authorize ListObjectsV2 as AWS does: s3:ListBucket on the bucket, with s3:prefix")


def test_session_credentials_reach_their_own_workspace_and_no_other(iam_enforced: dict[str, str],
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable import Workspace
    from jupyter_portable.store.credentials import issue

    bucket = iam_enforced["bucket"]
    url = f"s3://{bucket}/team"
    a, b = _two_workspaces(tmp_path, url)
    creds = issue(url, a.workspace_id, session_name="al-test")
    assert creds is not None
    assert creds.access_key_id != iam_enforced["key_id"] and creds.session_token
    assert iam_enforced["secret"] not in repr(creds) and creds.secret_access_key not in repr(creds)
    s3 = _s3_with(creds)
    own, other = f"team/workspaces/{a.workspace_id}", f"team/workspaces/{b.workspace_id}"

    # its own workspace: read, list, create a manifest
    assert json.loads(s3.get_object(Bucket=bucket, Key=f"{own}/HEAD")["Body"].read())["workspace_id"] == a.workspace_id
    assert s3.list_objects_v2(Bucket=bucket, Prefix=f"{own}/manifests/")["KeyCount"] == 1
    s3.put_object(Bucket=bucket, Key=f"{own}/manifests/probe", Body=b"mine", IfNoneMatch="*")
    s3.get_object(Bucket=bucket, Key="team/config.json")
    # another workspace's: refused to read, to write and to list
    assert _denied(lambda: s3.get_object(Bucket=bucket, Key=f"{other}/HEAD"))
    assert _denied(lambda: s3.put_object(Bucket=bucket, Key=f"{other}/HEAD", Body=b"{}"))
    assert _denied(lambda: s3.list_objects_v2(Bucket=bucket, Prefix=f"{other}/"))
    # nor may it enumerate the shared blobs, delete anything, or leave the store's prefix
    assert _denied(lambda: s3.list_objects_v2(Bucket=bucket, Prefix="team/objects/"))
    assert _denied(lambda: s3.list_objects_v2(Bucket=bucket))
    assert _denied(lambda: s3.delete_object(Bucket=bucket, Key=f"{own}/manifests/probe"))
    assert _denied(lambda: s3.put_object(Bucket=bucket, Key="elsewhere/x", Body=b"x"))

    # the whole store API, as the worker uses it: a snapshot of its own workspace publishes,
    # reading the other workspace is refused
    for name, value in (("AWS_ACCESS_KEY_ID", creds.access_key_id), ("AWS_SECRET_ACCESS_KEY", creds.secret_access_key),
                        ("AWS_SESSION_TOKEN", creds.session_token)):
        monkeypatch.setenv(name, value)
    (a.root / "results.txt").write_text("loss 0.1\n")
    res = Workspace.find(a.root).snapshot("from the worker", progress=None)
    assert res.version == 2
    from jupyter_portable.core.errors import StoreError
    from jupyter_portable.store.repo import Store

    with pytest.raises(StoreError, match="access denied"):
        Store.open(url).read_head(b.workspace_id)


def _refused_as_existing(call: Any) -> bool:
    """A create-only PutObject on a key that exists: S3 answers 412 Precondition Failed."""
    from botocore.exceptions import ClientError

    try:
        call()
    except ClientError as exc:
        return exc.response["Error"]["Code"] in ("PreconditionFailed", "412")
    return False


def test_a_workers_credentials_create_but_never_replace_what_the_store_holds(iam_enforced: dict[str, str],
                                                                            tmp_path: Path) -> None:
    """Issue 28, item 3: the blobs every workspace shares, the index and wheel records, and the
    workspace's own manifests take only create-only writes; the head only a compare-and-swap;
    the workspace's documents none. On an unversioned bucket a replaced object is a deleted one."""
    import boto3

    from jupyter_portable.store.credentials import issue

    bucket = iam_enforced["bucket"]
    url = f"s3://{bucket}/team"
    a, b = _two_workspaces(tmp_path, url)
    user = boto3.session.Session().client("s3")  # the user's own keys (a fresh session reads them)
    user.put_object(Bucket=bucket, Key="team/wheels/worker/" + "0" * 64 + "/cp311.json", Body=b'{"set": 1}')
    user.put_object(Bucket=bucket, Key=f"team/workspaces/{a.workspace_id}/settings.json", Body=b"{}")
    shared = [item["Key"] for part in ("objects", "index", "wheels")
              for item in user.list_objects_v2(Bucket=bucket, Prefix=f"team/{part}/").get("Contents", [])]
    own = f"team/workspaces/{a.workspace_id}"
    manifests = [item["Key"] for item in user.list_objects_v2(Bucket=bucket, Prefix=f"{own}/manifests/")["Contents"]]
    assert any("/objects/" in k for k in shared) and any("/index/" in k for k in shared) and manifests
    before = {k: user.get_object(Bucket=bucket, Key=k)["Body"].read() for k in [*shared, *manifests]}

    creds = issue(url, a.workspace_id, session_name="al-root")
    assert creds is not None
    s3 = _s3_with(creds)  # what the machine's root holds
    for key in [*shared, *manifests]:
        assert _denied(lambda k=key: s3.put_object(Bucket=bucket, Key=k, Body=b"junk")), key
        assert _refused_as_existing(lambda k=key: s3.put_object(Bucket=bucket, Key=k, Body=b"junk",
                                                                IfNoneMatch="*")), key
        assert _denied(lambda k=key: s3.delete_object(Bucket=bucket, Key=k)), key
    assert {k: user.get_object(Bucket=bucket, Key=k)["Body"].read() for k in before} == before

    # the head: only a compare-and-swap (publishing); never blind, never a create
    head = f"{own}/HEAD"
    got = user.get_object(Bucket=bucket, Key=head)
    body, etag = got["Body"].read(), got["ETag"]
    assert _denied(lambda: s3.put_object(Bucket=bucket, Key=head, Body=b"{}"))
    assert _denied(lambda: s3.put_object(Bucket=bucket, Key=head, Body=b"{}", IfNoneMatch="*"))
    assert _refused_as_existing(lambda: s3.put_object(Bucket=bucket, Key=head, Body=b"{}", IfMatch='"0123"'))
    s3.put_object(Bucket=bucket, Key=head, Body=body, IfMatch=etag)
    # its documents are the user's side's: not even a conditional write
    doc = f"{own}/settings.json"
    doc_etag = user.head_object(Bucket=bucket, Key=doc)["ETag"]
    for cond in ({}, {"IfMatch": doc_etag}, {"IfNoneMatch": "*"}):
        assert _denied(lambda c=cond: s3.put_object(Bucket=bucket, Key=doc, Body=b'{"budget": 1e9}', **c)), cond
    assert user.get_object(Bucket=bucket, Key=doc)["Body"].read() == b"{}"

    # what a snapshot needs still works: a new blob, created once
    fresh = "team/objects/ff/" + "f" * 64
    s3.put_object(Bucket=bucket, Key=fresh, Body=b"new", IfNoneMatch="*")
    assert _refused_as_existing(lambda: s3.put_object(Bucket=bucket, Key=fresh, Body=b"other", IfNoneMatch="*"))
    assert user.get_object(Bucket=bucket, Key=fresh)["Body"].read() == b"new"


def test_a_store_prefix_with_a_policy_wildcard_is_refused(aws_env: dict[str, str], tmp_path: Path) -> None:
    """A ``*``, ``?`` or ``$`` in a prefix would make the worker's policy name other keys than the store's."""
    from jupyter_portable import Workspace
    from jupyter_portable.core.errors import UsageError
    from jupyter_portable.store.credentials import issue, session_policy

    bucket = make_bucket()
    for prefix in ("team*", "te?m", "t/${aws:username}"):
        with pytest.raises(UsageError, match="wildcard or a variable"):
            Workspace.init(tmp_path / "ws", f"s3://{bucket}/{prefix}")
        assert not (tmp_path / "ws" / ".portable").exists()
        with pytest.raises(UsageError, match="wildcard or a variable"):
            session_policy(bucket, prefix, "ws-abc")
        with pytest.raises(UsageError, match="wildcard or a variable"):
            issue(f"s3://{bucket}/{prefix}", "ws-abc", session_name="al-1", environ={})
    assert session_policy(bucket, "team/a-b_c.d", "ws-abc")["Statement"]


def test_a_store_whose_names_make_a_session_policy_longer_than_sts_takes_is_refused_at_init(
        aws_env: dict[str, str], tmp_path: Path) -> None:
    from jupyter_portable import Workspace
    from jupyter_portable.core.errors import UsageError
    from jupyter_portable.store.credentials import MAX_POLICY_CHARS, session_policy

    bucket = make_bucket()
    long_prefix = "/".join(["experiments-of-the-vision-group"] * 4)
    with pytest.raises(UsageError, match=f"too long for a worker's session policy .* STS takes {MAX_POLICY_CHARS}"):
        Workspace.init(tmp_path / "ws", f"s3://{bucket}/{long_prefix}")
    assert not (tmp_path / "ws" / ".portable").exists()
    ws = Workspace.init(tmp_path / "ok", f"s3://{bucket}/experiments-of-the-vision-group")
    assert len(json.dumps(session_policy(bucket, "experiments-of-the-vision-group", ws.workspace_id),
                          separators=(",", ":"))) <= MAX_POLICY_CHARS


def test_init_on_a_bucket_without_versioning_warns_and_names_the_risk(aws_env: dict[str, str], tmp_path: Path,
                                                                     cli: Any) -> None:
    import boto3

    bucket = make_bucket()
    proc = cli("init", str(tmp_path / "off"), "--store", f"s3://{bucket}/team", "--json")
    out = json.loads(proc.stdout)
    assert len(out["warnings"]) == 1
    for text in (out["warnings"][0], proc.stderr):
        assert f"bucket {bucket} keeps no old versions (versioning is off)" in text
        assert "replaced or deleted there is gone for good" in text
        assert f"put-bucket-versioning --bucket {bucket}" in text
    assert "warning: " in proc.stderr

    s3 = boto3.session.Session().client("s3")
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    out = cli.json("init", str(tmp_path / "suspended"), "--store", f"s3://{bucket}/other")
    assert "(versioning is suspended)" in out["warnings"][0]

    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    proc = cli("init", str(tmp_path / "on"), "--store", f"s3://{bucket}/third")
    assert "warning" not in proc.stderr and proc.stdout.startswith("initialized workspace")
    assert cli.json("init", str(tmp_path / "file"), "--store", f"file://{tmp_path}/store")["warnings"] == []


def test_without_a_role_the_federation_token_is_scoped_and_not_the_users_key(aws_env: dict[str, str]) -> None:
    from jupyter_portable.store.credentials import issue, session_policy

    creds = issue("s3://some-bucket/p", "ws-abc", session_name="al-1", environ={})
    assert creds is not None and creds.access_key_id != aws_env["AWS_ACCESS_KEY_ID"] and creds.session_token
    # the policy it sends: nothing outside the prefix, this workspace's keys only
    policy = session_policy("some-bucket", "p", "ws-abc")
    resources = [r for s in policy["Statement"] for r in s["Resource"]]
    assert all(r.startswith("arn:aws:s3:::some-bucket/p/") or r == "arn:aws:s3:::some-bucket" for r in resources)
    assert not any("workspaces/*" in r or r.endswith("workspaces/") for r in resources)
    assert not any("Delete" in a for s in policy["Statement"] for a in s["Action"])


def test_a_file_store_sends_no_credentials() -> None:
    from jupyter_portable.store.credentials import issue, store_env

    assert issue("file:///tmp/store", "ws-abc", session_name="al-1") is None
    assert store_env("file:///tmp/store", {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_REGION": "eu-west-1"}) == {}
    assert store_env("s3://b/p", {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_PROFILE": "admin", "AWS_REGION": "eu-west-1"}) \
        == {"AWS_REGION": "eu-west-1"}


# -- a worker on the local market, its kernel, and the refresh ------------------------------------

def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def _assert_clean(pid: int, user: dict[str, str], what: str) -> dict[str, str]:
    env = _environ(pid)
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "JUPYTER_PORTABLE_S3_ROLE_ARN", *PROVIDER_KEYS):
        assert name not in env, f"{what} has {name}"
    for secret in (user["key_id"], user["secret"], *PROVIDER_KEYS.values()):
        assert secret.encode() not in raw, f"{what} holds a secret"
    return env


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc/PID/environ")
def test_a_local_worker_holds_no_long_lived_key_and_its_credentials_are_scoped_and_refreshed(
        iam_enforced: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Any) -> None:
    from datetime import timedelta

    from jupyter_portable import Workspace
    from jupyter_portable.orchestration.orchestrator import Orchestrator
    from jupyter_portable.store.credentials import SessionCredentials
    from jupyter_portable.worker.client import AgentClient, load_record

    portable_env(tmp_path, monkeypatch)
    for name, value in PROVIDER_KEYS.items():
        monkeypatch.setenv(name, value)
    bucket = iam_enforced["bucket"]
    url = f"s3://{bucket}/team"
    try:
        a, b = _two_workspaces(tmp_path, url)
        out = cli.json("continue", cwd=a.root)
        assert out["state"] == "ACTIVE"
        aid = out["allocation_id"]
        ws = Workspace.find(a.root)
        rec = load_record(ws.copy, aid)
        assert rec is not None
        client = AgentClient(rec)
        client.start_kernel("k-env")
        kernels = [p for p in _children(rec.pid) if "ipykernel" in Path(f"/proc/{p}/cmdline").read_text()]
        assert kernels, "the kernel did not start"
        machine_pid = int(rec.allocation.details["pid"])
        _assert_clean(rec.pid, iam_enforced, "the worker agent")
        kernel_env = _assert_clean(kernels[0], iam_enforced, "the kernel")
        _assert_clean(machine_pid, iam_enforced, "the machine's process")

        # the store credentials: a 0600 file that botocore reads, scoped to this workspace
        folder = Path(kernel_env["AWS_CONFIG_FILE"]).parent
        cred_file = folder / "credentials.json"
        assert stat.S_IMODE(cred_file.stat().st_mode) == 0o600
        held = SessionCredentials.from_json(json.loads(cred_file.read_text()))
        assert held.access_key_id != iam_enforced["key_id"]
        s3 = _s3_with(held)
        s3.get_object(Bucket=bucket, Key=f"team/workspaces/{a.workspace_id}/HEAD")
        assert _denied(lambda: s3.get_object(Bucket=bucket, Key=f"team/workspaces/{b.workspace_id}/HEAD"))
        # the machine's root, with them, cannot replace what the store holds: not the blobs that
        # workspace b shares, not a manifest of its own workspace
        import boto3

        user = boto3.session.Session().client("s3")
        blobs = [item["Key"] for item in user.list_objects_v2(Bucket=bucket, Prefix="team/objects/")["Contents"]]
        mine = user.list_objects_v2(Bucket=bucket, Prefix=f"team/workspaces/{a.workspace_id}/manifests/")
        kept = {k: user.get_object(Bucket=bucket, Key=k)["Body"].read()
                for k in [*blobs, *(item["Key"] for item in mine["Contents"])]}
        for key in kept:
            assert _denied(lambda k=key: s3.put_object(Bucket=bucket, Key=k, Body=b"junk")), key
            assert _refused_as_existing(lambda k=key: s3.put_object(Bucket=bucket, Key=k, Body=b"junk",
                                                                    IfNoneMatch="*")), key
        assert {k: user.get_object(Bucket=bucket, Key=k)["Body"].read() for k in kept} == kept
        # the worker reads and writes its own workspace with them
        (Path(rec.workdir) / "from-worker.txt").write_text("written on the machine\n")
        assert client.snapshot("on the worker")["version"] >= 2
        status = client.status()
        assert status["credentials"]["expiration"] == held.expiration
        assert held.secret_access_key not in json.dumps(status)

        # refresh: not due now; due when the clock nears expiry; the agent takes them at once
        orch = Orchestrator(ws)
        try:
            assert orch.refresh_credentials(now=held.expires_at() - timedelta(hours=2)) is None
            new = orch.refresh_credentials(now=held.expires_at() - timedelta(minutes=5))
        finally:
            orch.close()
        assert new is not None
        fresh = SessionCredentials.from_json(json.loads(cred_file.read_text()))
        assert fresh.access_key_id != held.access_key_id
        assert stat.S_IMODE(cred_file.stat().st_mode) == 0o600
        assert client.status()["credentials"]["expiration"] == new == fresh.expiration
        (Path(rec.workdir) / "after-refresh.txt").write_text("still publishing\n")
        assert client.snapshot("after the refresh")["version"] >= 3

        # junk is refused and changes nothing
        from jupyter_portable.core.errors import UsageError

        with pytest.raises(UsageError, match="AccessKeyId"):
            client.request("PUT", "/credentials", {"Version": 1, "AccessKeyId": "", "SecretAccessKey": "x",
                                                   "SessionToken": "y", "Expiration": fresh.expiration})
        assert SessionCredentials.from_json(json.loads(cred_file.read_text())) == fresh
        client.close()
        cli.json("stop", cwd=a.root)
    finally:
        release_all()


def test_a_local_worker_of_a_file_store_gets_no_aws_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         cli: Any) -> None:
    from jupyter_e2e import make_workspace

    from jupyter_portable import Workspace
    from jupyter_portable.worker.client import AgentClient, load_record

    dirs = portable_env(tmp_path, monkeypatch)
    user = {"key_id": "AKIAUSERKEY0000000001", "secret": "user-long-lived-secret"}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", user["key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", user["secret"])
    for name, value in PROVIDER_KEYS.items():
        monkeypatch.setenv(name, value)
    try:
        make_workspace(tmp_path / "ws", dirs["store"])
        out = cli.json("continue", cwd=tmp_path / "ws")
        rec = load_record(Workspace.find(tmp_path / "ws").copy, out["allocation_id"])
        assert rec is not None
        env = _assert_clean(rec.pid, user, "the worker agent")
        assert "AWS_CONFIG_FILE" not in env
        client = AgentClient(rec)
        assert client.status()["credentials"] == {"expiration": None}
        client.close()
        cli.json("stop", cwd=tmp_path / "ws")
    finally:
        release_all()
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == user["secret"]  # the user's side keeps them


def test_an_agent_on_a_machine_whose_environment_holds_keys_starts_its_kernel_without_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rented machine's own environment (the SSH session's, the image's) may carry keys: the
    agent drops them before its kernel starts."""
    from jupyter_e2e import make_workspace

    from jupyter_portable.compute.base import Allocation
    from jupyter_portable.worker.client import AgentClient, AgentRecord, _start_local
    from jupyter_portable.worker.protocol import READY_PREFIX

    monkeypatch.setenv("JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES", "0")
    ws = make_workspace(tmp_path / "ws", tmp_path / "store")
    head = ws.store.read_head(ws.workspace_id)[0]
    machine = tmp_path / "machine"
    config = {"store": ws.config.store, "workspace_id": ws.workspace_id, "allocation_id": "al-keys1",
              "version": head.version, "epoch": head.epoch, "workdir": str(machine / "work"),
              "state_dir": str(machine / "agent"),
              "env": {"AWS_REGION": "eu-west-1", "RUNPOD_API_KEY": "sent-by-mistake"}}
    user = {"key_id": "AKIAMACHINEKEY000001", "secret": "machine-long-lived-secret"}
    env = {**os.environ, "AWS_ACCESS_KEY_ID": user["key_id"], "AWS_SECRET_ACCESS_KEY": user["secret"],
           "AWS_PROFILE": "admin", **PROVIDER_KEYS,
           "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]),
                                                     os.environ.get("PYTHONPATH")) if p)}
    (machine / "work").mkdir(parents=True)
    rc, out, err = _start_local(json.dumps(config), env=env, cwd=str(machine / "work"), timeout=60,
                                log=machine / "agent" / "agent.log")
    assert rc == 0, err
    info = json.loads(next(line for line in out.splitlines() if line.startswith(READY_PREFIX))[len(READY_PREFIX):])
    rec = AgentRecord(Allocation("al-keys1", "local", "x", "ref", "2026-12-01T00:00:00Z"), int(info["port"]),
                      int(info["pid"]), str(info["token"]), str(machine / "work"))
    client = AgentClient(rec)
    try:
        assert client.wait(lambda s: s["phase"] in ("ready", "failed"), timeout=60)["phase"] == "ready"
        client.start_kernel("k-keys")
        kernels = [p for p in _children(rec.pid) if "ipykernel" in Path(f"/proc/{p}/cmdline").read_text()]
        assert kernels, "the kernel did not start"
        kernel_env = _assert_clean(kernels[0], user, "the kernel")
        assert "sent-by-mistake" not in json.dumps(kernel_env)
        assert kernel_env["AWS_REGION"] == "eu-west-1"  # what the store needs still gets there
        assert client.status()["credentials"] == {"expiration": None}
    finally:
        client.shutdown()
        client.close()
