"""Scoped, short-lived S3 credentials for a worker: what a rented machine may do in the store.

A worker runs notebook code on a machine someone else owns, so it never gets the user's
own AWS keys. For an ``s3://`` store the server asks STS for session credentials
(``AssumeRole`` of ``JUPYTER_PORTABLE_S3_ROLE_ARN`` when set, else ``GetFederationToken``
with the user's keys) restricted by an inline session policy to what one workspace needs:

- read ``PREFIX/workspaces/<workspace_id>/*`` (its head, manifests, documents) and list
  only under it;
- create its manifests (``PutObject`` only with ``If-None-Match: *``) and move its head
  (``PutObject`` only with ``If-Match: <ETag>``, the compare-and-swap of a publish);
  nothing else there: its settings, reservations and allocations are the user's side's;
- read and create ``PREFIX/objects/*``, ``PREFIX/index/*`` and ``PREFIX/wheels/*``, create
  only: blobs are content-addressed and shared by every workspace of the store, so they
  cannot be split by workspace, but a blob that exists is never replaced (the same key
  holds the same bytes). No listing there: a blob is reached only by a hash that a
  manifest of this workspace names (or by already holding its bytes);
- read ``PREFIX/config.json``; nothing else, and no delete anywhere (nothing on a worker
  deletes).

S3 evaluates the conditions through its ``s3:if-none-match`` and ``s3:if-match`` keys, so a
worker's credentials cannot overwrite what other workspaces need, nor any manifest; a
service that ignores them is why ``init`` warns when the bucket keeps no versions
(:func:`jupyter_portable.store.s3.S3Backend.durability_warnings`). A prefix holding a
character a policy reads as a wildcard or a variable (``*``, ``?``, ``$``) is refused, and so
is a bucket and prefix too long for STS to take the policy (2048 characters: a prefix of up
to 48 characters fits with any bucket name, 81 with a 30-character one), both at ``init``.

On the worker the credentials live in a 0600 file that botocore reads through
``credential_process``: a running process picks up refreshed ones when they near expiry,
and neither the worker's nor the kernel's environment holds a key. A ``file://`` store
gets no credentials at all.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from jupyter_portable.core.envconfig import DEFAULT_SESSION_S, MAX_SESSION_S, MIN_SESSION_S, PortableS3
from jupyter_portable.core.errors import StoreError, UsageError
from jupyter_portable.core.secretenv import is_secret
from jupyter_portable.core.times import parse_iso, to_iso
from jupyter_portable.core.validate import check_workspace_id
from jupyter_portable.workdir.files import atomic_write

ROLE_ENV = "JUPYTER_PORTABLE_S3_ROLE_ARN"
DURATION_ENV = "JUPYTER_PORTABLE_S3_SESSION_SECONDS"
DEFAULT_DURATION_S = DEFAULT_SESSION_S
# STS's bounds (AssumeRole's upper bound is the role's MaxSessionDuration, 1 h by default)
MIN_DURATION_S, MAX_DURATION_S = MIN_SESSION_S, MAX_SESSION_S
# refreshed this long before expiry: botocore re-reads the file 15 min before it
REFRESH_MARGIN = timedelta(minutes=30)
CREDENTIALS_FILE = "credentials.json"
CONFIG_FILE = "config"

# what the worker needs of the server's AWS configuration for the store: no secret, no profile
_FORWARD = ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE",
            "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "AWS_S3_ADDRESSING_STYLE", "AWS_USE_DUALSTACK_ENDPOINT",
            "AWS_USE_FIPS_ENDPOINT")


@dataclass(frozen=True)
class SessionCredentials:
    """STS session credentials; the secret parts never appear in a repr."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str = field(repr=False)
    expiration: str  # ISO 8601, UTC

    def expires_at(self) -> datetime:
        return parse_iso(self.expiration, "the credentials' expiration")

    def due(self, now: datetime, margin: timedelta = REFRESH_MARGIN) -> bool:
        """Whether they should be replaced at ``now``: expired, or expiring within ``margin``."""
        return self.expires_at() - now <= margin

    def to_json(self) -> dict[str, Any]:
        """The ``credential_process`` document botocore reads (also the agent's wire format)."""
        return {"Version": 1, "AccessKeyId": self.access_key_id, "SecretAccessKey": self.secret_access_key,
                "SessionToken": self.session_token, "Expiration": self.expiration}

    @classmethod
    def from_json(cls, obj: Any) -> "SessionCredentials":
        """Validated; UsageError naming the field that is wrong."""
        if not isinstance(obj, dict):
            raise UsageError("credentials must be a JSON object")
        if obj.get("Version") != 1:
            raise UsageError("credentials need \"Version\": 1")
        out = []
        for key in ("AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration"):
            value = obj.get(key)
            if not isinstance(value, str) or not value or len(value) > 4096 or not value.isprintable():
                raise UsageError(f"credentials need a non-empty {key!r} of printable text")
            out.append(value)
        creds = cls(*out)
        creds.expires_at()  # a readable, zoned time
        return creds


def s3_location(store_url: str) -> tuple[str, str] | None:
    """``(bucket, prefix)`` of an ``s3://`` store; None for any other store."""
    parsed = urlparse(store_url)
    if parsed.scheme not in ("s3", "s3a"):
        return None
    return parsed.netloc, parsed.path.strip("/")


# what IAM reads in a resource ARN or a StringLike value as other than itself
_POLICY_SPECIAL = frozenset("*?$")
# STS refuses a longer session policy (plain text, without whitespace)
MAX_POLICY_CHARS = 2048
_EXAMPLE_WORKSPACE = "ws-" + "0" * 20  # as long as every workspace id this package makes


def check_policy_text(bucket: str, prefix: str) -> None:
    """UsageError when a bucket or prefix holds a character IAM would read as a wildcard or a
    policy variable: the policy would grant keys other than the store's."""
    for what, text in (("bucket", bucket), ("prefix", prefix)):
        bad = sorted(set(text) & _POLICY_SPECIAL)
        if bad:
            raise UsageError(f"the s3:// store's {what} {text!r} holds {' '.join(repr(c) for c in bad)}, which a "
                             "worker's IAM policy would read as a wildcard or a variable",
                             hint="use a store prefix of letters, digits and - _ . / only")


def check_store_url(store_url: str) -> None:
    """That a worker's session policy can name an ``s3://`` store as typed, and only it (a ``?``
    there would otherwise be read as the start of a query and dropped without a word); UsageError."""
    if s3_location(store_url) is None:
        return
    bucket, _, prefix = store_url.split("://", 1)[1].partition("/")
    check_policy_text(bucket, prefix)
    session_policy(bucket, prefix, _EXAMPLE_WORKSPACE)


def session_policy(bucket: str, prefix: str, workspace_id: str, *, partition: str = "aws") -> dict[str, Any]:
    """The inline session policy: one workspace's keys, the shared blobs created only, the store
    marker. UsageError when the store's names cannot be written in one (see the module's docstring)."""
    check_workspace_id(workspace_id)
    check_policy_text(bucket, prefix)
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
    arn = f"arn:{partition}:s3:::{bucket}"
    own = f"{base}workspaces/{workspace_id}/"
    shared = [f"{arn}/{base}{part}/*" for part in ("objects", "index", "wheels")]
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": ["s3:GetObject"],
             "Resource": [f"{arn}/{own}*", *shared, f"{arn}/{base}config.json"]},
            # create only (If-None-Match: *): a manifest, a blob, an index or a wheel record that
            # exists is never replaced
            {"Effect": "Allow", "Action": ["s3:PutObject"], "Resource": [f"{arn}/{own}manifests/*", *shared],
             "Condition": {"Null": {"s3:if-none-match": "false"}}},
            # the head only by compare-and-swap (If-Match: <ETag>): a publish
            {"Effect": "Allow", "Action": ["s3:PutObject"], "Resource": [f"{arn}/{own}HEAD"],
             "Condition": {"Null": {"s3:if-match": "false"}}},
            {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": [arn],
             "Condition": {"StringLike": {"s3:prefix": [f"{own}*"]}}},
        ],
    }
    size = len(json.dumps(policy, separators=(",", ":")))
    if size > MAX_POLICY_CHARS:
        raise UsageError(f"the s3:// store's bucket and prefix are too long for a worker's session policy "
                         f"({size} characters; STS takes {MAX_POLICY_CHARS})",
                         hint="use a shorter store prefix: the policy names it once for each kind of key")
    return policy


def duration_from(environ: Mapping[str, str] | None = None) -> int:
    """The session length asked of STS, in seconds (``c.PortableS3.session_seconds``,
    ``JUPYTER_PORTABLE_S3_SESSION_SECONDS``)."""
    return int(PortableS3.current(environ).session_seconds)


def store_env(store_url: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The non-secret settings a worker needs to reach the store: region and endpoint, only for s3://."""
    if s3_location(store_url) is None:
        return {}
    env = os.environ if environ is None else environ
    return {k: env[k] for k in _FORWARD if env.get(k) and not is_secret(k)}


def issue(store_url: str, workspace_id: str, *, session_name: str, environ: Mapping[str, str] | None = None,
          client: Any = None) -> SessionCredentials | None:
    """Session credentials for a worker of ``workspace_id``; None when the store is not ``s3://``.

    ``session_name`` (the allocation id) names the session in CloudTrail. StoreError, with
    what to fix, when STS refuses."""
    location = s3_location(store_url)
    if location is None:
        return None
    check_store_url(store_url)
    bucket, prefix = location
    section = PortableS3.current(environ)  # c.PortableS3, or its variables; checked as they are read
    role, duration = section.role_arn, int(section.session_seconds)
    name = re.sub(r"[^\w+=,.@-]", "-", session_name)
    if client is None:
        import boto3.session  # heavy: only when a worker of an s3:// store starts

        # a session of its own: the default one keeps the credentials it resolved first
        client = boto3.session.Session().client("sts")
    partition = role.split(":")[1] if role else "aws"
    policy = json.dumps(session_policy(bucket, prefix, workspace_id, partition=partition), separators=(",", ":"))
    try:
        if role:
            answer = client.assume_role(RoleArn=role, RoleSessionName=f"jupyter-portable-{name}"[:64],
                                        DurationSeconds=duration, Policy=policy)
        else:
            answer = client.get_federation_token(Name=f"jp-{name}"[:32], DurationSeconds=duration, Policy=policy)
    except Exception as exc:  # noqa: BLE001 - botocore's errors, translated here
        code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", "")) or type(exc).__name__
        how = f"AssumeRole of {role}" if role else "GetFederationToken"
        hint = ("check that your AWS identity may assume the role (its trust policy) and that the role allows "
                "the store's bucket" if role else
                f"GetFederationToken needs an IAM user's own keys; or set {ROLE_ENV} to a role made for "
                "workers (README: the IAM role for workers)")
        raise StoreError(f"cannot get scoped credentials for the worker from STS ({how}: {code})",
                         hint=hint) from None
    c = answer["Credentials"]
    expiration = c["Expiration"]
    expiration = to_iso(expiration, "seconds") if isinstance(expiration, datetime) else str(expiration)
    return SessionCredentials(c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"], expiration)


def install(folder: Path, creds: SessionCredentials) -> dict[str, str]:
    """Write ``creds`` (0600) under ``folder`` with a botocore config that reads them, and
    return the environment that points botocore there and nowhere else."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    write(folder, creds)
    config = folder / CONFIG_FILE
    # credential_process runs without a shell; `cat` is on every machine the worker runs on
    reader = shlex.join(["cat", str(folder / CREDENTIALS_FILE)])
    atomic_write(config, f"[default]\ncredential_process = {reader}\n".encode(), mode=0o600)
    return {"AWS_CONFIG_FILE": str(config),
            # not the machine's ~/.aws/credentials, nor its instance role: only these
            "AWS_SHARED_CREDENTIALS_FILE": str(folder / "no-shared-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true"}


def write(folder: Path, creds: SessionCredentials) -> None:
    """Replace the credentials file whole (a refresh): readers see the old or the new, never half."""
    atomic_write(folder / CREDENTIALS_FILE, json.dumps(creds.to_json()).encode(), mode=0o600)


__all__ = ["CREDENTIALS_FILE", "DEFAULT_DURATION_S", "DURATION_ENV", "MAX_POLICY_CHARS", "REFRESH_MARGIN",
           "ROLE_ENV", "SessionCredentials", "check_policy_text", "check_store_url", "duration_from", "install",
           "issue", "s3_location", "session_policy", "store_env", "write"]
