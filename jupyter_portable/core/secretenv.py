"""Which environment variables hold a secret, or lead to one: none of them reaches a worker or a kernel.

A worker runs notebook code on someone else's machine, so its environment (and its
kernel's, which inherits it) carries no provider key and none of the user's own AWS
credentials, profiles or credential files. The store's scoped session credentials reach
it another way (``store.credentials``).
"""

from __future__ import annotations

from collections.abc import Mapping

SECRET_NAMES = frozenset({
    # the user's AWS identity, and every way botocore finds one
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "FSSPEC_S3_KEY", "FSSPEC_S3_SECRET", "FSSPEC_S3_TOKEN",
    # GPU providers and clouds
    "RUNPOD_API_KEY", "VAST_API_KEY", "LAMBDA_API_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_AUTH_ACCESS_TOKEN", "CLOUDSDK_AUTH_CREDENTIAL_FILE_OVERRIDE",
    "GOOGLE_OAUTH_ACCESS_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PATH", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
    # ours: the role the server assumes for workers, the key that reaches rented machines
    "JUPYTER_PORTABLE_S3_ROLE_ARN", "JUPYTER_PORTABLE_SSH_KEY",
})

# any other name shaped like a secret (JUPYTERHUB_API_TOKEN, GITHUB_TOKEN, OPENAI_API_KEY, ...)
SECRET_SUFFIXES = ("_API_KEY", "_SECRET", "_SECRET_KEY", "_ACCESS_KEY", "_TOKEN", "_PASSWORD", "_CREDENTIALS")


def is_secret(name: str) -> bool:
    """Whether the variable ``name`` holds a secret, or says where one is."""
    upper = name.upper()
    return upper in SECRET_NAMES or upper.endswith(SECRET_SUFFIXES)


def scrubbed(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without a secret: the base of every worker's and kernel's environment."""
    return {k: v for k, v in environ.items() if not is_secret(k)}


__all__ = ["SECRET_NAMES", "SECRET_SUFFIXES", "is_secret", "scrubbed"]
