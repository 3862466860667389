"""Each provider's settings, read and validated here and nowhere else: one ``Configurable`` per
provider (``c.PortableRunPod.api_url = ...`` in ``jupyter_server_config.py``), listed by
``jupyter portable --help-all``. A trait tagged ``env="NAME"`` takes the environment variable
``NAME`` as its default, where no config file sets it (the Jupyter order:
:class:`~jupyter_portable.core.envconfig.EnvConfigurable`, shared with the settings that belong to
no provider).

Secrets are never traits: API keys stay in the environment (``RUNPOD_API_KEY``, ...) or the
provider's own credential files, so that no config file, ``--help-all`` or config dump holds one.

This module imports only traitlets, so the CLI reads settings without loading httpx or a cloud SDK.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traitlets import Bool, Float, Int, List, Unicode, default, validate
from traitlets.config import Configurable

from jupyter_portable.core.envconfig import EnvConfigurable
from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.validate import short_repr

# which providers exist (compute.registry maps each to its class)
PROVIDER_NAMES = ("local", "ssh", "runpod", "vastai", "lambda", "aws", "gcp", "slurm")
PROVIDERS_ENV = "JUPYTER_PORTABLE_PROVIDERS"

# the providers' own defaults: where their APIs are, which image, which login
RUNPOD_API = "https://api.runpod.io"
RUNPOD_IMAGE = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404"
RUNPOD_SPOT_BID = 0.6  # a spot pod's bid, a fraction of the on-demand price
VAST_API = "https://console.vast.ai"
VAST_IMAGE = "vastai/base-image:@vastai-automatic-tag"
LAMBDA_API = "https://cloud.lambda.ai"
LAMBDA_SSH_USER = "ubuntu"  # Lambda Stack images log in as ubuntu, not root
AWS_IMAGE = "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
GCP_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu128-ubuntu-2204-nvidia-570"
CLOUD_SSH_USER = "ubuntu"


def provider_names(value: list[str] | tuple[str, ...], where: str) -> list[str]:
    """``value`` checked against the known providers; UsageError naming ``where`` otherwise."""
    names = [str(n).strip() for n in value if str(n).strip()]
    unknown = [n for n in names if n not in PROVIDER_NAMES]
    if unknown:
        raise UsageError(f"unknown provider(s) in {where}: {', '.join(unknown)}",
                         hint=f"choose from {', '.join(PROVIDER_NAMES)}")
    return names


def spot_bid_fraction(value: object, where: str = "RUNPOD_SPOT_BID") -> float:
    """A bid as a fraction of the on-demand price, more than 0 and at most 1; UsageError otherwise."""
    try:
        fraction = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None
    except ValueError:
        fraction = None
    if fraction is None or not 0 < fraction <= 1:
        raise UsageError(f"runpod: {where} must be a fraction of the on-demand price more than 0 and at most 1 "
                         f"(such as {RUNPOD_SPOT_BID}), got {short_repr(value)}",
                         hint="this setting affects RunPod's interruptible (spot) offers only")
    return fraction


def _url(owner: EnvConfigurable, name: str, value: str) -> str:
    value = value.strip()
    if value and not value.startswith(("http://", "https://")):
        raise UsageError(f"{owner.where(name)} must be an http(s) URL, got {short_repr(value)}")
    return value


def _user(owner: EnvConfigurable, name: str, value: str) -> str:
    value = value.strip()
    if not value or any(c.isspace() or c in "@:/" for c in value):
        raise UsageError(f"{owner.where(name)} must be a login name, got {short_repr(value)}")
    return value


class PortableLocal(EnvConfigurable):
    """The local demo market ("local"): worker processes on this computer, rented from a catalog."""

    catalog = Unicode(help="""The market's catalog of offers (TOML, docs/catalog.md). Default: the
        demo catalog shipped with the package. Environment: JUPYTER_PORTABLE_CATALOG. Example:
        c.PortableLocal.catalog = "/home/me/gpus.toml" """).tag(config=True, env="JUPYTER_PORTABLE_CATALOG")

    market_dir = Unicode(help="""Where the market keeps its machines' state. Default:
        <jupyter data dir>/portable/market. Environment: JUPYTER_PORTABLE_MARKET_DIR.""").tag(
        config=True, env="JUPYTER_PORTABLE_MARKET_DIR")

    seed = Unicode("", help="""Makes the market's launch failures (a catalog's launch_failure_rate)
        repeatable: each launch draws from this seed and its number, in every process sharing the
        market. Default: none (a fresh draw each time). Environment: JUPYTER_PORTABLE_MARKET_SEED.
        Example: c.PortableLocal.seed = "1" """).tag(config=True, env="JUPYTER_PORTABLE_MARKET_SEED")

    @default("catalog")
    def _catalog_default(self) -> str:
        return str(Path(__file__).parents[1] / "demo" / "demo-catalog.toml")

    @validate("seed")
    def _check_seed(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip()
        if len(value) > 64 or not value.isprintable():
            raise UsageError(f"{self.named('seed')} must be printable text of at most 64 characters, "
                             f"got {short_repr(value)}")
        return value

    @default("market_dir")
    def _market_dir_default(self) -> str:
        from jupyter_core.paths import jupyter_data_dir

        return str(Path(jupyter_data_dir()) / "portable" / "market")


class PortableSsh(EnvConfigurable):
    """Your own machines over SSH ("ssh"), listed in a hosts file (docs/configuration.md)."""

    hosts_file = Unicode(help="""The hosts (TOML). Default: <jupyter config dir>/portable/hosts.toml;
        a missing default file means no hosts, a missing file named here is an error. Environment:
        JUPYTER_PORTABLE_HOSTS.""").tag(config=True, env="JUPYTER_PORTABLE_HOSTS")

    state_dir = Unicode(help="""Where the provider records which host serves which allocation.
        Default: <jupyter data dir>/portable/ssh. Environment: JUPYTER_PORTABLE_SSH_STATE.""").tag(
        config=True, env="JUPYTER_PORTABLE_SSH_STATE")

    connect_timeout = Float(10.0, help="""Seconds ssh waits for a host to answer (its ConnectTimeout,
        the banner included) before a command or a port forward gives up: how long one look at a
        host that does not answer takes. Environment: JUPYTER_PORTABLE_SSH_CONNECT_TIMEOUT.""").tag(
        config=True, env="JUPYTER_PORTABLE_SSH_CONNECT_TIMEOUT")

    @validate("connect_timeout")
    def _check_connect_timeout(self, proposal: Any) -> float:
        value = float(proposal["value"])
        if not 1 <= value <= 600:
            raise UsageError(f"{self.where('connect_timeout')} must be seconds from 1 to 600, got {value:g}")
        return value

    @default("hosts_file")
    def _hosts_file_default(self) -> str:
        from jupyter_core.paths import jupyter_config_dir

        return str(Path(jupyter_config_dir()) / "portable" / "hosts.toml")

    @default("state_dir")
    def _state_dir_default(self) -> str:
        from jupyter_core.paths import jupyter_data_dir

        return str(Path(jupyter_data_dir()) / "portable" / "ssh")

    def names_hosts_file(self) -> bool:
        """Whether the hosts file was named (a config file or the environment), not the default:
        a missing default means no hosts, a missing named file is an error."""
        return self.hosts_file != self._hosts_file_default()


class PortableRunPod(EnvConfigurable):
    """RunPod ("runpod"). The key stays in $RUNPOD_API_KEY, never in a config file."""

    api_url = Unicode(RUNPOD_API, help="""RunPod's REST API (a proxy, or a test twin). Environment:
        RUNPOD_API_URL.""").tag(config=True, env="RUNPOD_API_URL")

    graphql_url = Unicode("", help="""RunPod's GraphQL API. Default: /graphql on api_url.
        Environment: RUNPOD_GRAPHQL_URL.""").tag(config=True, env="RUNPOD_GRAPHQL_URL")

    image = Unicode(RUNPOD_IMAGE, help="""The container image a pod starts from when the
        workspace names none.""").tag(config=True)

    spot = Bool(False, help="""List interruptible (spot) pods too, bidding spot_bid. Environment:
        RUNPOD_SPOT (1, true, yes or on). Example: c.PortableRunPod.spot = True""").tag(
        config=True, env="RUNPOD_SPOT")

    spot_bid = Float(RUNPOD_SPOT_BID, help="""A spot pod's bid, as a fraction of the on-demand price
        (more than 0, at most 1). Environment: RUNPOD_SPOT_BID.""").tag(
        config=True, env="RUNPOD_SPOT_BID", parse=spot_bid_fraction)

    cloud = Unicode("SECURE", help="""Which of RunPod's clouds pods are rented in: SECURE (RunPod's
        data centres) or COMMUNITY (hosts of the community, cheaper; deployed with a public IP, so
        that SSH reaches the pod directly). Environment: RUNPOD_CLOUD. Example:
        c.PortableRunPod.cloud = 'COMMUNITY'""").tag(config=True, env="RUNPOD_CLOUD")

    @validate("api_url", "graphql_url")
    def _check_url(self, proposal: Any) -> str:
        return _url(self, proposal["trait"].name, proposal["value"])

    @validate("cloud")
    def _check_cloud(self, proposal: Any) -> str:
        value = str(proposal["value"]).strip().upper()
        if value not in ("SECURE", "COMMUNITY"):
            raise UsageError(f"{self.where('cloud')} must be SECURE or COMMUNITY, got {short_repr(proposal['value'])}")
        return value

    @validate("spot_bid")
    def _check_bid(self, proposal: Any) -> float:
        return spot_bid_fraction(proposal["value"], self.where("spot_bid"))


class PortableVast(EnvConfigurable):
    """Vast.ai ("vastai"). The key stays in $VAST_API_KEY, never in a config file."""

    api_url = Unicode(VAST_API, help="""Vast.ai's API (a proxy, or a test twin). Environment:
        VAST_API_URL.""").tag(config=True, env="VAST_API_URL")

    image = Unicode(VAST_IMAGE, help="""The container image an instance starts from when the
        workspace names none.""").tag(config=True)

    @validate("api_url")
    def _check_url(self, proposal: Any) -> str:
        return _url(self, "api_url", proposal["value"])


class PortableLambda(EnvConfigurable):
    """Lambda ("lambda"). The key stays in $LAMBDA_API_KEY, never in a config file."""

    api_url = Unicode(LAMBDA_API, help="""Lambda's API (a proxy, or a test twin). Environment:
        LAMBDA_API_URL.""").tag(config=True, env="LAMBDA_API_URL")

    ssh_user = Unicode(LAMBDA_SSH_USER, help="""The login on Lambda's machines. Environment:
        LAMBDA_SSH_USER.""").tag(config=True, env="LAMBDA_SSH_USER")

    ssh_key_names = List(Unicode(), help="""SSH keys already registered with Lambda to put on each
        machine. Default: none (the launch's own key is registered). Environment:
        LAMBDA_SSH_KEY_NAMES (comma-separated). Example: c.PortableLambda.ssh_key_names = ["laptop"]""").tag(
        config=True, env="LAMBDA_SSH_KEY_NAMES")

    @validate("api_url")
    def _check_url(self, proposal: Any) -> str:
        return _url(self, "api_url", proposal["value"])

    @validate("ssh_user")
    def _check_user(self, proposal: Any) -> str:
        return _user(self, "ssh_user", proposal["value"])


class PortableAws(EnvConfigurable):
    """AWS EC2 ("aws"). Credentials stay with boto3 (its environment variables, ~/.aws, a role)."""

    ssh_user = Unicode(CLOUD_SSH_USER, help="""The login on the image. Environment:
        JUPYTER_PORTABLE_AWS_SSH_USER.""").tag(config=True, env="JUPYTER_PORTABLE_AWS_SSH_USER")

    ssh_cidr = Unicode("", help="""Where SSH to the machines comes from (a CIDR such as
        203.0.113.7/32). Default: this computer's address as checkip.amazonaws.com sees it.
        Environment: JUPYTER_PORTABLE_SSH_CIDR.""").tag(config=True, env="JUPYTER_PORTABLE_SSH_CIDR")

    image = Unicode(AWS_IMAGE, help="""The AMI (an id, or resolve:ssm:<parameter>) a machine boots
        when the workspace names none.""").tag(config=True)

    @validate("ssh_user")
    def _check_user(self, proposal: Any) -> str:
        return _user(self, "ssh_user", proposal["value"])


class PortableGcp(EnvConfigurable):
    """Google Cloud ("gcp"). Credentials stay with google-auth (ADC, GOOGLE_APPLICATION_CREDENTIALS)."""

    project = Unicode("", help="""The project VMs are made in. Environment:
        GOOGLE_CLOUD_PROJECT.""").tag(config=True, env="GOOGLE_CLOUD_PROJECT")

    endpoint = Unicode("", help="""Compute Engine's API endpoint (a proxy, or a test twin).
        Environment: JUPYTER_PORTABLE_GCP_ENDPOINT.""").tag(config=True, env="JUPYTER_PORTABLE_GCP_ENDPOINT")

    ssh_user = Unicode(CLOUD_SSH_USER, help="""The login on the image. Environment:
        JUPYTER_PORTABLE_GCP_SSH_USER.""").tag(config=True, env="JUPYTER_PORTABLE_GCP_SSH_USER")

    image = Unicode(GCP_IMAGE, help="""The image (or image family) a VM boots when the workspace
        names none.""").tag(config=True)

    @validate("ssh_user")
    def _check_user(self, proposal: Any) -> str:
        return _user(self, "ssh_user", proposal["value"])


class PortableSlurm(EnvConfigurable):
    """A Slurm cluster ("slurm"), reached through its login node over SSH (docs/slurm.md)."""

    login_host = Unicode("", help="""The login node as ssh reaches it (a Host from ~/.ssh/config
        works). Environment: JUPYTER_PORTABLE_SLURM_LOGIN. Example:
        c.PortableSlurm.login_host = "login.hpc.example.edu" """).tag(config=True, env="JUPYTER_PORTABLE_SLURM_LOGIN")

    login_port = Int(22, help="""sshd's port on the login node. Environment:
        JUPYTER_PORTABLE_SLURM_PORT.""").tag(config=True, env="JUPYTER_PORTABLE_SLURM_PORT")

    login_user = Unicode("", help="""The login there. Default: ssh's (this user, or ~/.ssh/config's).
        Environment: JUPYTER_PORTABLE_SLURM_USER.""").tag(config=True, env="JUPYTER_PORTABLE_SLURM_USER")

    gpu_hour_rate = Float(0.0, help="""The cluster's internal price per GPU-hour in $; 0 means free.
        Spend and budget count GPU-hours at this rate. Environment: JUPYTER_PORTABLE_SLURM_GPU_HOUR_RATE.
        Example: c.PortableSlurm.gpu_hour_rate = 0.5""").tag(
        config=True, env="JUPYTER_PORTABLE_SLURM_GPU_HOUR_RATE")

    signal_lead_s = Float(300.0, help="""Seconds before the walltime at which the job is warned
        (sbatch --signal=B:USR1@<lead>).""").tag(config=True)

    time_limit_s = Int(0, help="""The walltime a job asks for, in seconds (rounded up to whole
        minutes); a shorter one may start sooner (backfill). 0: each partition's own limit.
        Example: c.PortableSlurm.time_limit_s = 4 * 3600""").tag(config=True)

    partitions = List(Unicode(), help="""Only these partitions (default: every partition with GPUs).
        Example: c.PortableSlurm.partitions = ["gpu", "gpu-long"]""").tag(config=True)

    node_ssh_port = Int(22, help="""sshd's port on the compute nodes. Environment:
        JUPYTER_PORTABLE_SLURM_NODE_SSH_PORT.""").tag(config=True, env="JUPYTER_PORTABLE_SLURM_NODE_SSH_PORT")

    proxy_jump = Bool(True, help="""Reach the compute nodes through the login node (ssh's ProxyJump,
        held to the login node's pinned host key), as on most clusters, where only the login node is
        reachable from outside. False: directly, at the address Slurm has for each node.
        Example: c.PortableSlurm.proxy_jump = False""").tag(config=True)

    queue_next = Bool(False, help="""Queue each job's successor while it runs (sbatch
        --dependency=afterany on it), and Continue onto it by itself when the job ends (its walltime,
        a preemption): the same notebook, kernel id and checkpoint go on there, with no click. Off: the
        sidebar asks in time, before the walltime. Environment: JUPYTER_PORTABLE_SLURM_QUEUE_NEXT=1.
        Example: c.PortableSlurm.queue_next = True""").tag(config=True, env="JUPYTER_PORTABLE_SLURM_QUEUE_NEXT")

    @validate("time_limit_s")
    def _check_time_limit(self, proposal: Any) -> int:
        if proposal["value"] < 0:
            raise UsageError(f"{self.where('time_limit_s')} must be 0 (the partition's) or more seconds")
        return int(proposal["value"])

    @validate("gpu_hour_rate", "signal_lead_s")
    def _check_rate(self, proposal: Any) -> float:
        value = proposal["value"]
        if not 0 <= value < float("inf"):
            raise UsageError(f"{self.where(proposal['trait'].name)} must be 0 or more, got {short_repr(value)}")
        return float(value)


# each provider's section, and how its traits become its class's keyword arguments
SECTIONS: dict[str, tuple[type[EnvConfigurable], dict[str, str]]] = {
    "local": (PortableLocal, {"catalog": "catalog_path", "market_dir": "state_dir", "seed": "seed"}),
    "ssh": (PortableSsh, {"hosts_file": "hosts_file", "state_dir": "state_dir", "connect_timeout": "connect_timeout"}),
    "runpod": (PortableRunPod, {"api_url": "base_url", "graphql_url": "graphql_url", "image": "default_image",
                                "spot": "include_spot", "spot_bid": "spot_bid", "cloud": "cloud"}),
    "vastai": (PortableVast, {"api_url": "base_url", "image": "default_image"}),
    "lambda": (PortableLambda, {"api_url": "base_url", "ssh_user": "ssh_user", "ssh_key_names": "ssh_key_names"}),
    "aws": (PortableAws, {"ssh_user": "ssh_user", "ssh_cidr": "ssh_cidr", "image": "image"}),
    "gcp": (PortableGcp, {"project": "project", "endpoint": "endpoint", "ssh_user": "ssh_user", "image": "image"}),
    "slurm": (PortableSlurm, {"login_host": "login_host", "login_port": "login_port", "login_user": "login_user",
                              "gpu_hour_rate": "gpu_hour_rate",
                              "signal_lead_s": "signal_lead_s", "time_limit_s": "time_limit_s",
                              "partitions": "partitions",
                              "node_ssh_port": "node_ssh_port", "queue_next": "queue_next_job",
                              "proxy_jump": "proxy_jump"}),
}
SETTINGS_CLASSES: tuple[type[EnvConfigurable], ...] = tuple(cls for cls, _ in SECTIONS.values())


def provider_kwargs(name: str, parent: Configurable | None = None) -> dict[str, Any]:
    """The keyword arguments the provider ``name`` is built with: its section of the configuration
    ``parent`` holds (none: the environment and the defaults), validated."""
    cls, arguments = SECTIONS[name]
    section = cls(parent=parent) if parent is not None else cls()
    return {arg: getattr(section, trait) for trait, arg in arguments.items()}


def default_provider_names(hosts_file: str | Path | None = None) -> list[str]:
    """``local``, plus ``ssh`` when the hosts file exists."""
    hosts = Path(hosts_file if hosts_file is not None else PortableSsh().hosts_file).expanduser()
    return ["local", "ssh"] if hosts.is_file() else ["local"]


class ProviderChoice(EnvConfigurable):
    """Which providers are asked: the one definition of ``c.Portable.providers`` (``interfaces.config.Portable``
    is one of these), read here too by the code that is given no providers (:func:`env_provider_names`)."""

    providers = List(Unicode(), help="""Which providers are asked for GPUs, in order: any of
        local, ssh, runpod, vastai, lambda, aws, gcp, slurm. Cloud providers are opt-in, so no cloud
        API is called unless named here. Default: local, plus ssh when a hosts file exists.
        Environment: JUPYTER_PORTABLE_PROVIDERS (comma-separated). Example:
        c.Portable.providers = ["local", "runpod"]""").tag(config=True, env=PROVIDERS_ENV)

    def providers_hosts_file(self) -> str | None:
        """The hosts file whose presence adds ``ssh`` to the default (None: the ssh section's)."""
        return None

    @default("providers")
    def _providers_default(self) -> list[str]:
        return default_provider_names(self.providers_hosts_file())

    @validate("providers")
    def _check_providers(self, proposal: Any) -> list[str]:
        return provider_names(proposal["value"], self.where("providers"))


def env_provider_names() -> list[str]:
    """The providers ``$JUPYTER_PORTABLE_PROVIDERS`` names, validated; the default without it."""
    return list(ProviderChoice().providers)


__all__ = ["PROVIDER_NAMES", "SECTIONS", "SETTINGS_CLASSES", "EnvConfigurable", "PortableAws", "PortableGcp",
           "PortableLambda", "PortableLocal", "PortableRunPod", "PortableSlurm", "PortableSsh", "PortableVast",
           "ProviderChoice", "default_provider_names", "env_provider_names", "provider_kwargs", "provider_names",
           "spot_bid_fraction"]
