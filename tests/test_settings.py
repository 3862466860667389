"""Each provider's settings, the Jupyter way (compute/config): a trait of its own section
(``c.PortableRunPod.api_url``) set in a Jupyter config file reaches the provider, its environment
variable sets it where no config file does (the Jupyter order: an argument, the file, the variable,
the default), a bad value is refused naming what the user set, and ``jupyter portable --help-all``
documents every one. No setting holds a secret."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli

from jupyter_portable.compute.config import PROVIDER_NAMES, SECTIONS, PortableLocal, PortableRunPod
from jupyter_portable.compute.registry import PROVIDERS, enabled_providers
from jupyter_portable.core.envconfig import PortableRun, use_config
from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.secretenv import SECRET_NAMES, is_secret
from jupyter_portable.interfaces.config import CLASSES, ENV, Portable, load_config

CLOUDS = ["runpod", "vastai", "lambda", "aws", "gcp"]


@pytest.fixture
def conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A Jupyter config dir of the test's own, and no setting's variable from the outside."""
    directory = tmp_path / "jupyter-config"
    directory.mkdir()
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(directory))
    monkeypatch.delenv("JUPYTER_CONFIG_PATH", raising=False)
    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    yield directory
    use_config(None)  # the configuration a Portable of this test handed to core.envconfig


def providers_from(conf: Path, text: str) -> dict[str, Any]:
    (conf / "jupyter_server_config.py").write_text(text)
    return Portable(config=load_config()).make_providers()


def test_each_providers_section_in_a_config_file_reaches_the_provider(conf: Path) -> None:
    made = providers_from(conf, f"""c.Portable.providers = {CLOUDS!r}
c.PortableRunPod.api_url = "http://127.0.0.1:9/runpod"
c.PortableRunPod.spot = True
c.PortableRunPod.spot_bid = 0.8
c.PortableRunPod.image = "me/torch:1"
c.PortableVast.api_url = "http://127.0.0.1:9/vast"
c.PortableLambda.ssh_user = "lambda-user"
c.PortableLambda.ssh_key_names = ["laptop", "desk"]
c.PortableAws.ssh_user = "ec2-user"
c.PortableAws.ssh_cidr = "203.0.113.7/32"
c.PortableAws.image = "ami-0abc1234"
c.PortableGcp.endpoint = "http://127.0.0.1:9/gcp"
c.PortableGcp.project = "my-project"
c.PortableGcp.ssh_user = "gcp-user"
""")
    runpod, vast, lam, aws, gcp = (made[n] for n in CLOUDS)
    assert runpod._api.base_url == "http://127.0.0.1:9/runpod"
    assert runpod.graphql_url == "http://127.0.0.1:9/runpod/graphql"
    assert (runpod.include_spot, runpod.spot_bid, runpod.default_image) == (True, 0.8, "me/torch:1")
    assert vast._api.base_url == "http://127.0.0.1:9/vast"
    assert (lam.ssh_user, lam.ssh_key_names) == ("lambda-user", ["laptop", "desk"])
    assert (aws.ssh_user, aws._ssh_cidr, aws.image) == ("ec2-user", "203.0.113.7/32", "ami-0abc1234")
    assert (gcp.endpoint, gcp._project, gcp.ssh_user) == ("http://127.0.0.1:9/gcp", "my-project", "gcp-user")


def test_the_local_and_ssh_sections_reach_their_providers_and_c_portable_still_wins(conf: Path,
                                                                                   tmp_path: Path) -> None:
    made = providers_from(conf, f"""c.Portable.providers = ["local", "ssh"]
c.PortableLocal.catalog = {str(tmp_path / "section.toml")!r}
c.PortableLocal.market_dir = {str(tmp_path / "market")!r}
c.PortableSsh.state_dir = {str(tmp_path / "ssh")!r}
""")
    assert made["local"].catalog_path == tmp_path / "section.toml"
    assert made["local"].state_dir == tmp_path / "market"
    assert made["ssh"].state_dir == tmp_path / "ssh"
    (conf / "jupyter_server_config.py").write_text(
        f"c.PortableLocal.catalog = 'section.toml'\nc.Portable.catalog = {str(tmp_path / 'old.toml')!r}\n")
    assert Portable(config=load_config()).catalog == str(tmp_path / "old.toml")


def test_a_config_file_wins_over_an_environment_variable_which_sets_what_no_file_does(
        conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = 'c.Portable.providers = ["runpod", "aws"]\nc.PortableRunPod.api_url = "http://file.test"\n'
    monkeypatch.setenv("RUNPOD_API_URL", "http://env.test")
    monkeypatch.setenv("JUPYTER_PORTABLE_AWS_SSH_USER", "from-env")
    made = providers_from(conf, text)
    assert made["runpod"]._api.base_url == "http://file.test"
    assert made["aws"].ssh_user == "from-env"  # the file does not set it: the variable does
    assert providers_from(conf, 'c.Portable.providers = ["runpod"]\n')["runpod"]._api.base_url == "http://env.test"
    # an argument given to the section wins over both
    section = PortableRunPod(config=load_config(), api_url="http://argument.test")
    assert section.api_url == "http://argument.test"
    # orchestration's own fallback (no config file) builds each provider from the same sections
    monkeypatch.setenv("JUPYTER_PORTABLE_PROVIDERS", "runpod")
    monkeypatch.setenv("RUNPOD_API_URL", "http://env.test")
    monkeypatch.setenv("RUNPOD_SPOT", "yes")
    assert [(p._api.base_url, p.include_spot) for p in enabled_providers().values()] == [("http://env.test", True)]


@pytest.mark.parametrize("line, message", [
    ("c.PortableRunPod.spot_bid = 2.0", "runpod: c.PortableRunPod.spot_bid must be a fraction"),
    ("c.PortableRunPod.api_url = 'api.runpod.io'", "c.PortableRunPod.api_url must be an http(s) URL"),
    ("c.PortableLambda.ssh_user = 'root@host'", "c.PortableLambda.ssh_user must be a login name"),
    ("c.PortableAws.ssh_user = ''", "c.PortableAws.ssh_user must be a login name"),
    ("c.PortableGcp.ssh_user = 'a b'", "c.PortableGcp.ssh_user must be a login name"),
    ("c.Portable.providers = ['runpod', 'nimbus']", "unknown provider(s) in c.Portable.providers: nimbus"),
])
def test_a_bad_value_in_a_config_file_is_refused_naming_the_trait(conf: Path, line: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        providers_from(conf, f"c.Portable.providers = {CLOUDS!r}\n{line}\n")
    assert str(info.value).startswith(message)


def test_a_value_of_the_wrong_type_in_a_config_file_is_one_usage_error(conf: Path) -> None:
    with pytest.raises(UsageError) as info:
        providers_from(conf, "c.Portable.providers = ['runpod']\nc.PortableRunPod.spot_bid = 'high'\n")
    assert str(info.value).startswith("c.PortableRunPod: The 'spot_bid' trait of a PortableRunPod instance "
                                      "expected a float")
    with pytest.raises(UsageError, match="^c.Portable: The 'check_interval_s' trait"):
        providers_from(conf, "c.Portable.check_interval_s = 'often'\n")


@pytest.mark.parametrize("var, value, message", [
    ("LAMBDA_API_URL", "ftp://x", "LAMBDA_API_URL must be an http(s) URL"),
    ("JUPYTER_PORTABLE_GCP_SSH_USER", "me:you", "JUPYTER_PORTABLE_GCP_SSH_USER must be a login name"),
    ("RUNPOD_SPOT_BID", "cheap", "runpod: RUNPOD_SPOT_BID must be a fraction"),
    ("JUPYTER_PORTABLE_PROVIDERS", "local,nimbus", "unknown provider(s) in JUPYTER_PORTABLE_PROVIDERS: nimbus"),
    ("JUPYTER_PORTABLE_ENVIRONMENT", "newest", "JUPYTER_PORTABLE_ENVIRONMENT must be one of"),
])
def test_a_bad_environment_variable_is_refused_naming_the_variable(
        conf: Path, monkeypatch: pytest.MonkeyPatch, var: str, value: str, message: str) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(UsageError) as info:  # the file sets no providers where the variable is the test's
        providers_from(conf, "" if var == "JUPYTER_PORTABLE_PROVIDERS" else f"c.Portable.providers = {CLOUDS!r}\n")
    assert str(info.value).startswith(message)


def test_a_bad_provider_setting_is_one_line_from_the_command(cli: Cli, tmp_path: Path) -> None:
    conf = tmp_path / "jupyter-config"
    conf.mkdir()
    (conf / "jupyter_server_config.py").write_text(
        "c.Portable.providers = ['local', 'runpod']\nc.PortableRunPod.spot_bid = 1.5\n")
    for var in ENV.values():
        cli.env.pop(var, None)
    proc = cli("offers", check=False, extra_env={"JUPYTER_CONFIG_DIR": str(conf),
                                                 "JUPYTER_PORTABLE_MARKET_DIR": str(tmp_path / "market")})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[0].startswith(
        "error: runpod: c.PortableRunPod.spot_bid must be a fraction of the on-demand price")


def test_help_all_documents_every_section_and_variable(cli: Cli) -> None:
    out = cli("--help-all").stdout
    for cls in CLASSES:
        for name in cls.class_own_traits(config=True):
            assert f"--{cls.__name__}.{name}=" in out
    for setting, var in ENV.items():
        assert var in out, setting
    assert {"RUNPOD_API_URL", "RUNPOD_SPOT_BID", "LAMBDA_SSH_KEY_NAMES", "JUPYTER_PORTABLE_SSH_CIDR",
            "JUPYTER_PORTABLE_GCP_ENDPOINT", "JUPYTER_PORTABLE_AWS_SSH_USER"} <= set(ENV.values())


# Settings whose variable the package treats as a secret (never sent to a machine, never logged)
# though the setting holds no secret: a key file's path and a role's name, which a config file may hold.
KEPT_FROM_MACHINES = {"c.PortableRemote.ssh_key": "JUPYTER_PORTABLE_SSH_KEY",
                      "c.PortableS3.role_arn": "JUPYTER_PORTABLE_S3_ROLE_ARN"}


def test_no_setting_holds_a_secret_and_every_provider_has_a_section() -> None:
    secret_shaped = {setting: var for setting, var in ENV.items() if var in SECRET_NAMES or is_secret(var)}
    assert secret_shaped == KEPT_FROM_MACHINES
    for var in KEPT_FROM_MACHINES.values():
        assert is_secret(var)  # still kept from every machine's environment
    for cls in CLASSES:
        for name in cls.class_own_traits(config=True):
            assert not any(word in name for word in ("api_key", "secret", "token", "password")), name
    assert tuple(PROVIDERS) == PROVIDER_NAMES == tuple(SECTIONS)


@pytest.mark.parametrize("name, var, good, other, bad, refused", [
    # the notebook's Python on a rented machine (handed to the orchestrator)
    ("environment", "JUPYTER_PORTABLE_ENVIRONMENT", "exact", "image", "newest", " must be one of auto, exact"),
    # who rents a notebook's first machine (handed by the server to the provisioner)
    ("first_machine", "JUPYTER_PORTABLE_FIRST_MACHINE", "open", "first-cell", "later",
     "='later' is not 'first-cell' or 'open'"),
    # how long a cloud machine may take to boot (handed to the orchestrator)
    ("boot_timeout", "JUPYTER_PORTABLE_BOOT_TIMEOUT", "runpod=600,900", "900", "aws=0",
     "='aws=0': 'aws=0' is not SECONDS"),
])
def test_a_portable_setting_from_the_file_or_its_variable_is_checked_naming_where_it_was_set(
        conf: Path, monkeypatch: pytest.MonkeyPatch, name: str, var: str, good: str, other: str, bad: str,
        refused: str) -> None:
    config = conf / "jupyter_server_config.py"
    config.write_text(f"c.Portable.{name} = {good!r}\n")
    assert getattr(Portable(config=load_config()), name) == good
    config.write_text(f"c.Portable.{name} = {bad!r}\n")
    with pytest.raises(UsageError) as info:
        Portable(config=load_config())
    assert str(info.value).startswith(f"c.Portable.{name}{refused}")
    config.unlink()
    monkeypatch.setenv(var, bad)
    with pytest.raises(UsageError) as info:
        Portable()
    assert str(info.value).startswith(f"{var}{refused}")
    monkeypatch.setenv(var, good)
    assert getattr(Portable(config=load_config()), name) == good  # no file sets it: the variable does
    config.write_text(f"c.Portable.{name} = {other!r}\n")
    assert getattr(Portable(config=load_config()), name) == other  # the file over the variable
    # orchestration reads the same setting, as the process's configuration (the file's) set it
    assert getattr(PortableRun.current(), name) == other
    use_config(None)  # a process that loaded no configuration: the variable
    assert getattr(PortableRun.current(), name) == good


def test_the_default_paths_follow_their_variables(conf: Path, monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    from jupyter_portable.demo.catalog import default_catalog_path
    from jupyter_portable.demo.market import default_market_dir

    assert default_catalog_path().name == "demo-catalog.toml"
    monkeypatch.setenv("JUPYTER_PORTABLE_CATALOG", str(tmp_path / "c.toml"))
    monkeypatch.setenv("JUPYTER_PORTABLE_MARKET_DIR", str(tmp_path / "m"))
    assert (default_catalog_path(), default_market_dir()) == (tmp_path / "c.toml", tmp_path / "m")
    assert PortableLocal().catalog == str(tmp_path / "c.toml")
    assert PortableRunPod(spot_bid=0.5).spot_bid == 0.5


def test_the_settings_read_deep_in_the_code_come_from_the_file_over_their_variables(
        conf: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """c.PortableWheels, c.PortableRemote and c.PortableS3 reach the code that reads them once a
    Portable has read the config files (the CLI and the server make one first)."""
    from jupyter_portable.compute.keys import user_key
    from jupyter_portable.store.credentials import duration_from
    from jupyter_portable.worker.trust import trust_path
    from jupyter_portable.worker.wheelset import index_sources

    assert index_sources(None, None, None) == []  # nothing set: uv's own index
    (conf / "jupyter_server_config.py").write_text(
        f"c.PortableWheels.find_links = [{str(tmp_path / 'wheels')!r}]\n"
        "c.PortableWheels.index_url = 'https://pypi.example/simple'\n"
        f"c.PortableWheels.trust_file = {str(tmp_path / 'trust.json')!r}\n"
        "c.PortableS3.session_seconds = 7200\n"
        f"c.PortableRemote.ssh_key = {str(tmp_path / 'missing')!r}\n")
    Portable(config=load_config())
    assert index_sources(None, None, None) == ["--find-links", str(tmp_path / "wheels"),
                                              "--index-url", "https://pypi.example/simple"]
    assert trust_path() == tmp_path / "trust.json"
    assert duration_from() == 7200
    with pytest.raises(UsageError) as info:
        user_key()
    assert str(info.value).startswith(f"c.PortableRemote.ssh_key={tmp_path / 'missing'} does not name a private key")
    # a variable is each setting's default: it sets what the file does not, and the file's values stay
    monkeypatch.setenv("JUPYTER_PORTABLE_WHEEL_FIND_LINKS", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    monkeypatch.setenv("JUPYTER_PORTABLE_NO_INDEX", "1")
    monkeypatch.setenv("JUPYTER_PORTABLE_TRUST_FILE", str(tmp_path / "other.json"))
    monkeypatch.setenv("JUPYTER_PORTABLE_S3_SESSION_SECONDS", "900")
    monkeypatch.setenv("JUPYTER_PORTABLE_SSH_KEY", str(tmp_path / "absent"))
    assert index_sources(None, None, None) == ["--find-links", str(tmp_path / "wheels"), "--no-index"]
    assert (trust_path(), duration_from()) == (tmp_path / "trust.json", 7200)
    with pytest.raises(UsageError) as info:
        user_key()
    assert str(info.value).startswith(f"c.PortableRemote.ssh_key={tmp_path / 'missing'} does not name a private key")
    # a process that loaded no configuration (a kernel, a worker) has the variables and the defaults
    use_config(None)
    assert index_sources(None, None, None) == ["--find-links", str(tmp_path / "a"), "--find-links",
                                              str(tmp_path / "b"), "--no-index"]
    assert (trust_path(), duration_from()) == (tmp_path / "other.json", 900)
    with pytest.raises(UsageError) as info:
        user_key()
    assert str(info.value).startswith(f"JUPYTER_PORTABLE_SSH_KEY={tmp_path / 'absent'} does not name a private key")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "mine")], check=True)
    monkeypatch.setenv("JUPYTER_PORTABLE_SSH_KEY", str(tmp_path / "mine"))
    assert user_key().private == tmp_path / "mine"
    monkeypatch.delenv("JUPYTER_PORTABLE_TRUST_FILE")
    assert trust_path().name == "trusted-wheels.json" and duration_from() == 900


@pytest.mark.parametrize("line, var, raw, refused", [
    ("c.PortableS3.role_arn = 'admin'", "JUPYTER_PORTABLE_S3_ROLE_ARN", "admin", " is not an IAM role ARN"),
    ("c.PortableS3.session_seconds = 60", "JUPYTER_PORTABLE_S3_SESSION_SECONDS", "60", "=60 must be whole seconds"),
    ("c.PortableWheels.index_url = 'pypi.org'", "JUPYTER_PORTABLE_INDEX_URL", "pypi.org", " must be a URL"),
    ("c.PortableRemote.workdir = ' '", None, None, " must name a folder on the machine"),
])
def test_a_bad_deep_setting_is_refused_naming_where_it_was_set(conf: Path, monkeypatch: pytest.MonkeyPatch,
                                                               line: str, var: str | None, raw: str | None,
                                                               refused: str) -> None:
    from jupyter_portable.interfaces.config import CLASSES

    section, trait = re.match(r"c\.(\w+)\.(\w+)", line).groups()  # type: ignore[union-attr]
    cls = next(c for c in CLASSES if c.__name__ == section)
    (conf / "jupyter_server_config.py").write_text(line + "\n")
    Portable(config=load_config())
    with pytest.raises(UsageError) as info:
        cls.current()
    assert str(info.value).startswith(f"c.{section}.{trait}{refused}")
    if var is not None:
        (conf / "jupyter_server_config.py").unlink()
        use_config(None)
        monkeypatch.setenv(var, raw)
        with pytest.raises(UsageError) as info:
            cls.current()
        assert str(info.value).startswith(f"{var}{refused}")


def test_every_variable_the_package_reads_is_a_setting_or_documented_as_not_one() -> None:
    """Each JUPYTER_PORTABLE_* name in the package's code is a trait's variable (so --help-all shows
    it) or a row of docs/configuration.md's table whose kind says why it is not a setting."""
    root = Path(__file__).resolve().parents[1]
    read = {m for path in (root / "jupyter_portable").rglob("*.py")
            for m in re.findall(r"JUPYTER_PORTABLE_[A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8"))}
    kinds: dict[str, str] = {}
    for row in (root / "docs" / "configuration.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 3:
            for name in re.findall(r"`(JUPYTER_PORTABLE_\w+)`", cells[0]):
                kinds[name] = cells[1]
    traits = set(ENV.values())
    not_settings = ("internal", "test hook", "setting of the kernel")
    undocumented = sorted(n for n in read - traits if not kinds.get(n, "").startswith(not_settings))
    assert undocumented == [], "make each a trait (core.envconfig, compute.config) or list it as internal"
    assert all(kinds.get(var, "").startswith("setting") for var in traits if var.startswith("JUPYTER_PORTABLE_"))
    assert "JUPYTER_PORTABLE_SSH_KEY" in traits and "JUPYTER_PORTABLE_GPU_SAMPLE_SECONDS" in read  # the scan works


def test_the_providers_variable_is_read_and_refused_the_same_way_with_or_without_a_config(
        conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable.compute.config import env_provider_names

    monkeypatch.setenv("JUPYTER_PORTABLE_PROVIDERS", "runpod, nope")
    messages = []
    for read in (lambda: Portable(config=load_config()).providers, env_provider_names):
        with pytest.raises(UsageError) as info:
            read()
        messages.append(str(info.value))
    assert messages == ["unknown provider(s) in JUPYTER_PORTABLE_PROVIDERS: nope"] * 2
    monkeypatch.setenv("JUPYTER_PORTABLE_PROVIDERS", " vastai ,lambda,")
    assert env_provider_names() == Portable(config=load_config()).providers == ["vastai", "lambda"]


def test_the_jupyter_order_an_argument_then_the_configuration_then_the_variable_then_the_default(
        conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from traitlets.config import Config

    env = {"JUPYTER_PORTABLE_ENVIRONMENT": "image"}
    assert PortableRun(environ={}).environment == "auto"  # the default
    assert PortableRun(environ=env).environment == "image"  # nothing else sets it: the variable
    file = Config({"Portable": {"environment": "exact"}})
    assert Portable(config=file, environ=env).environment == "exact"  # the configuration over the variable
    assert Portable(config=file, environ=env, environment="lockfile").environment == "lockfile"  # an argument
    assert PortableRun.current(environ=env).environment == "exact"  # what orchestration reads: the same
    # configuration counts wherever traitlets applies it: a parent class's section, a parent object's
    assert Portable(config=Config({"PortableRun": {"environment": "exact"}}), environ=env).environment == "exact"
    nested = Portable(config=Config({"Portable": {"PortableLocal": {"catalog": "/nested.toml"}}}), environ=env)
    assert PortableLocal(parent=nested, environ=env).catalog == "/nested.toml"
    # c.PortableLocal.catalog in a file wins over the variable through c.Portable's older name too
    monkeypatch.setenv("JUPYTER_PORTABLE_CATALOG", "/env/catalog.toml")
    assert Portable(config=Config({"PortableLocal": {"catalog": "/file.toml"}})).catalog == "/file.toml"
    assert Portable(config=Config()).catalog == "/env/catalog.toml"


def test_orchestration_reads_c_portable_as_configured_and_its_variables_only_as_defaults(
        conf: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The orchestrator, the kernel provisioner and the server's workspace read their settings from
    core.envconfig.PortableRun: c.Portable's as the process loaded it, else the variables."""
    from typing import cast

    from jupyter_portable.engine.workspace import Workspace
    from jupyter_portable.orchestration.monitor import find_workspace
    from jupyter_portable.orchestration.orchestrator import Orchestrator
    from jupyter_portable.orchestration.provisioner import first_machine_mode

    def read() -> tuple[Any, ...]:
        orch = Orchestrator(cast(Any, None))
        ws = find_workspace(str(tmp_path))
        return (first_machine_mode(), orch.cloud_boot_timeouts, orch.pass_env, orch.environment,
                ws.root.name if ws is not None else None)

    for name in ("from-env", "from-file"):
        Workspace.init(tmp_path / name, f"file://{tmp_path / 'store'}")
    monkeypatch.setenv("JUPYTER_PORTABLE_FIRST_MACHINE", "open")
    monkeypatch.setenv("JUPYTER_PORTABLE_BOOT_TIMEOUT", "600")
    monkeypatch.setenv("JUPYTER_PORTABLE_PASS_ENV", "FROM_ENV")
    monkeypatch.setenv("JUPYTER_PORTABLE_ENVIRONMENT", "image")
    monkeypatch.setenv("JUPYTER_PORTABLE_WORKSPACE", str(tmp_path / "from-env"))
    assert read() == ("open", {"*": 600.0}, ("FROM_ENV",), {"mode": "image"}, "from-env")
    (conf / "jupyter_server_config.py").write_text(
        "c.Portable.first_machine = 'first-cell'\nc.Portable.boot_timeout = 'aws=1200,900'\n"
        f"c.Portable.pass_env = ['FROM_FILE']\nc.Portable.environment = 'exact'\n"
        f"c.Portable.workspace = {str(tmp_path / 'from-file')!r}\n")
    Portable(config=load_config())  # what the CLI and the server do first
    assert read() == ("first-cell", {"*": 900.0, "aws": 1200.0}, ("FROM_FILE",), {"mode": "exact"}, "from-file")
    # what the server hands down explicitly wins over both
    assert find_workspace(str(tmp_path), str(tmp_path / "from-env")).root.name == "from-env"  # type: ignore[union-attr]
    orch = Orchestrator(cast(Any, None), pass_env=["GIVEN"], environment={"mode": "lockfile"}, boot_timeout="60")
    assert (orch.pass_env, orch.environment, orch.cloud_boot_timeouts) == (("GIVEN",), {"mode": "lockfile"},
                                                                           {"*": 60.0})
