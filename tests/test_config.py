"""Configuration the Jupyter way: ``c.Portable.*`` in the Jupyter config files, read by the
command and the server extension alike, with the documented environment variables as defaults
(a file's value wins over a variable, a command's flag over both)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli

from jupyter_portable.core.envconfig import PortableRun
from jupyter_portable.core.errors import UsageError
from jupyter_portable.interfaces.config import ENV, Portable, help_all

pytest_plugins = ["pytest_jupyter.jupyter_server"]

ONE_OFFER = """version = 1

[store]
region = "local-a"
egress_per_gb = 0.09

[[offer]]
id = "{id}"
gpu = "NVIDIA L4"
gpu_count = 1
gpu_memory_gb = 24
driver = "570.124.06"
cuda = "12.8"
price_per_hour = 0.5
region = "local-a"
capacity = 1
boot_seconds = 0
launch_failure_rate = 0.0
reliability = 0.99
bandwidth_mbps = 500
"""


def catalog(path: Path, offer_id: str) -> Path:
    path.write_text(ONE_OFFER.format(id=offer_id))
    return path


@pytest.fixture
def config_env(tmp_path: Path, cli: Cli) -> dict[str, str]:
    """A Jupyter config dir of the test's own, and no portable variable from the outside."""
    conf = tmp_path / "jupyter-config"
    conf.mkdir()
    for var in ENV.values():
        cli.env.pop(var, None)
    return {"JUPYTER_CONFIG_DIR": str(conf), "JUPYTER_PORTABLE_MARKET_DIR": str(tmp_path / "market")}


def offer_ids(cli: Cli, env: dict[str, str], *args: str) -> list[str]:
    proc = cli("offers", "--json", *args, extra_env=env)
    return [o["id"] for o in json.loads(proc.stdout)["offers"]]


def test_the_command_reads_c_portable_from_the_jupyter_config_files(tmp_path: Path, cli: Cli,
                                                                    config_env: dict[str, str]) -> None:
    mine = catalog(tmp_path / "mine.toml", "from-config-file")
    (Path(config_env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.py").write_text(
        f"c.Portable.providers = ['local']\nc.Portable.catalog = {str(mine)!r}\n")
    assert offer_ids(cli, config_env) == ["from-config-file"]


def test_the_file_wins_over_an_environment_variable_and_a_flag_wins_over_both(tmp_path: Path, cli: Cli,
                                                                             config_env: dict[str, str]) -> None:
    file = Path(config_env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.json"
    env = {**config_env, "JUPYTER_PORTABLE_CATALOG": str(catalog(tmp_path / "env.toml", "from-env"))}
    assert offer_ids(cli, env) == ["from-env"]  # no file sets it: the variable
    file.write_text(json.dumps({"Portable": {"catalog": str(catalog(tmp_path / "file.toml", "from-file"))}}))
    assert offer_ids(cli, env) == ["from-file"]
    file.write_text(json.dumps({"PortableLocal": {"catalog": str(tmp_path / "file.toml")}}))
    assert offer_ids(cli, env) == ["from-file"]  # the provider's own section too
    flag = catalog(tmp_path / "flag.toml", "from-flag")
    assert offer_ids(cli, env, "--catalog", str(flag)) == ["from-flag"]


def test_a_bad_setting_is_one_line_that_names_it(cli: Cli, config_env: dict[str, str]) -> None:
    (Path(config_env["JUPYTER_CONFIG_DIR"]) / "jupyter_server_config.py").write_text(
        "c.Portable.providers = ['local', 'cheapgpus']\n")
    proc = cli("offers", check=False, extra_env=config_env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: unknown provider(s) in c.Portable.providers: cheapgpus "
        "(to fix: choose from local, ssh, runpod, vastai, lambda, aws, gcp, slurm)"]


def test_help_all_lists_every_setting_with_its_variable(cli: Cli) -> None:
    out = cli("--help-all").stdout
    for name in [*Portable.class_own_traits(config=True), *PortableRun.class_own_traits(config=True)]:
        assert f"--Portable.{name}=" in out  # c.Portable's run settings are defined in core.envconfig
    assert "--PortableRun." not in out  # one documented name each
    for name, var in ENV.items():
        assert var in out, name
    assert help_all() in out


def test_intervals_are_bounded() -> None:
    with pytest.raises(UsageError, match="check_interval_s must be within"):
        Portable(check_interval_s=0)
    assert Portable(check_interval_s=5).check_interval_s == 5


@pytest.fixture
def jp_server_config(tmp_path: Path) -> dict[str, Any]:
    mine = catalog(tmp_path / "server.toml", "from-server-config")
    return {"ServerApp": {"jpserver_extensions": {"jupyter_portable": True}},
            "Portable": {"providers": ["local"], "catalog": str(mine), "check_interval_s": 7.5,
                         "first_machine": "open", "boot_timeout": "aws=1200,600"}}


@pytest.fixture
def jp_root_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from jupyter_e2e import make_workspace

    for var in ENV.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("JUPYTER_PORTABLE_MARKET_DIR", str(tmp_path / "market"))
    root = tmp_path / "workspace"
    make_workspace(root, tmp_path / "store")
    return root


async def test_the_server_extension_uses_c_portable(jp_serverapp: Any, jp_fetch: Any) -> None:
    service = jp_serverapp.web_app.settings["portable_service"]
    assert [t.callback_time for t in service._timers][0] == 7500
    assert service.first_machine == "open"  # what the provisioner asks before renting a first machine
    assert service.orchestrator().cloud_boot_timeouts == {"*": 600.0, "aws": 1200.0}
    answer = json.loads((await jp_fetch("portable", "api", "routes")).body)
    assert [r["offer"] for r in answer["routes"]] == ["from-server-config"]
