"""What environment reaches a worker or a kernel on a rented machine: an allow-list, and the
names passed through on purpose.

A worker runs notebook code on someone else's machine, so its environment (and its kernel's,
which inherits it) holds only variables known to carry no secret: a process's basics (PATH,
HOME, the locale), Python's, the GPU's and the image's libraries', the network's (proxies,
certificates) and package indexes', the store's settings, and this package's own. Anything
else (``PGPASSWORD``, ``AZURE_STORAGE_ACCOUNT_KEY``, ``DATABASE_URL``, a name no list foresaw)
stays behind: on the user's side when the machine's process is started from there (the local
market), and on the machine itself for the machine's own environment (the worker clears its
own before the kernel starts). Even an allowed name is dropped when it is shaped like a secret
(``NVIDIA_API_KEY``, ``UV_INDEX_X_PASSWORD``), and an allowed value that is a URL with
credentials in it (``PIP_INDEX_URL=https://me:token@host/simple``, ``HTTPS_PROXY``) arrives
without its ``user:password@``.

A variable the notebook needs on purpose is named in ``c.Portable.pass_env`` (or
``JUPYTER_PORTABLE_PASS_ENV``, names separated by commas or spaces): its value on the user's
side travels to the worker over SSH stdin, never argv or disk, and the machine's own value of
a name so passed is kept. An image may set ``JUPYTER_PORTABLE_PASS_ENV`` in its own
environment to keep variables of its own. The store's scoped session credentials reach the
worker another way (``store.credentials``). ``docs/security.md`` draws the boundary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from jupyter_portable.core.errors import UsageError

PASS_ENV = "JUPYTER_PORTABLE_PASS_ENV"
NAME_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,127}\Z")

ALLOWED_NAMES = frozenset({
    # a process's basics
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "PWD", "HOSTNAME",
    "XDG_RUNTIME_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME",
    # Python and the environments it runs in
    "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "PYTHONUTF8",
    "PYTHONHASHSEED", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "CONDA_EXE", "CONDA_PYTHON_EXE",
    "CONDA_SHLVL", "MAMBA_ROOT_PREFIX", "PYDEVD_DISABLE_FILE_VALIDATION",
    # the image's libraries, and where they keep their caches
    "LD_LIBRARY_PATH", "LIBRARY_PATH", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE",
    "TRANSFORMERS_CACHE", "TORCH_HOME", "MPLCONFIGDIR", "MPLBACKEND", "IPYTHONDIR",
    "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_PATH", "JUPYTER_PLATFORM_DIRS",
    # the network: proxies and certificates
    "http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    # the store's settings, none a secret (store.credentials sends the AWS ones)
    "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE",
    "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE", "AWS_S3_ADDRESSING_STYLE", "AWS_USE_DUALSTACK_ENDPOINT",
    "AWS_USE_FIPS_ENDPOINT", "AWS_EC2_METADATA_DISABLED", "STORAGE_EMULATOR_HOST", "HF_ENDPOINT",
    # what says which image and platform this is (engine/runtime/probe.detect_image)
    "container", "CONTAINER_IMAGE", "IMAGE_NAME", "DOCKER_IMAGE", "RUNPOD_POD_ID", "VAST_CONTAINERLABEL",
    "KUBERNETES_SERVICE_HOST",
})
# families of settings: the locale, the GPU and CUDA, thread counts, package indexes, this package's
ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "CUDNN_", "OMP_", "MKL_", "PIP_", "UV_",
                    "JUPYTER_PORTABLE_")

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
    "GOOGLE_OAUTH_ACCESS_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PATH", "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN", "PGPASSWORD", "PGPASSFILE", "MYSQL_PWD", "DATABASE_URL",
    # ours: the role the server assumes for workers, the key that reaches rented machines
    "JUPYTER_PORTABLE_S3_ROLE_ARN", "JUPYTER_PORTABLE_SSH_KEY",
})

# any other name shaped like a secret (JUPYTERHUB_API_TOKEN, GITHUB_TOKEN, OPENAI_API_KEY, ...)
SECRET_SUFFIXES = ("_KEY", "_SECRET", "_TOKEN", "_PASSWORD", "_PASSWD", "_PWD", "_CREDENTIALS", "_CREDENTIAL",
                   "_KEY_ID", "_KEYFILE", "_KEY_FILE", "_PASSPHRASE", "_AUTH")


def is_secret(name: str) -> bool:
    """Whether the variable ``name`` is shaped like a secret, or says where one is: never sent,
    logged or kept, even where an allow-list would let it through."""
    upper = name.upper()
    return upper in SECRET_NAMES or upper.endswith(SECRET_SUFFIXES)


def is_allowed(name: str) -> bool:
    """Whether ``name`` may reach a worker or a kernel without being passed on purpose."""
    return (name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)) and not is_secret(name)


def pass_names(value: str | Iterable[str] | None, what: str = PASS_ENV) -> tuple[str, ...]:
    """The variable names to pass through on purpose, from ``value`` (text separated by commas or
    spaces, or a list); UsageError naming ``what`` for one that is not a variable name."""
    if value is None:
        return ()
    items = value.replace(",", " ").split() if isinstance(value, str) else [str(v).strip() for v in value]
    bad = [n for n in items if not NAME_RE.match(n)]
    if bad:
        raise UsageError(f"{what}: {', '.join(repr(b) for b in bad[:5])} is not an environment variable name",
                         hint="name variables with letters, digits and '_', e.g. WANDB_API_KEY, separated by "
                              "commas or spaces")
    return tuple(dict.fromkeys(n for n in items if n))


# the user:password@ of a URL (https://me:token@pypi.example/simple, http://me:pw@proxy:3128)
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


def without_credentials(value: str) -> str:
    """``value`` with the ``user:password@`` of every URL in it taken out: an allowed setting
    (``PIP_INDEX_URL``, ``HTTPS_PROXY``) may carry a secret in its value."""
    return _URL_CREDENTIALS.sub("", value)


def scrubbed(environ: Mapping[str, str], passed: Iterable[str] = ()) -> dict[str, str]:
    """``environ`` with only what :func:`is_allowed`, credentials taken out of their URLs
    (:func:`without_credentials`), plus the names ``passed`` on purpose, as they are: the base of
    every worker's and kernel's environment."""
    keep = set(passed)
    return {k: v if k in keep else without_credentials(v) for k, v in environ.items() if is_allowed(k) or k in keep}


def passed_values(environ: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The values the user's side sends for ``names`` (those it has)."""
    return {n: environ[n] for n in names if n in environ}


__all__ = ["ALLOWED_NAMES", "ALLOWED_PREFIXES", "PASS_ENV", "SECRET_NAMES", "SECRET_SUFFIXES", "is_allowed",
           "is_secret", "pass_names", "passed_values", "scrubbed", "without_credentials"]
