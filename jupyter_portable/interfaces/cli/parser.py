"""``jupyter portable``'s arguments: one sub-parser per verb (the verbs themselves are
:data:`.commands.VERBS`, one table, as the server's routes are)."""

from __future__ import annotations

import argparse

from jupyter_portable.core.errors import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    """Every verb's arguments; which function does each verb is :data:`.commands.VERBS`."""
    p = _Parser(prog="jupyter portable", description="A durable workspace for notebooks on rented GPUs.")
    p.add_argument("--help-all", action="store_true",
                   help="also list every setting (c.Portable.* in jupyter_server_config.py) and its environment "
                        "variable")
    sub = p.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)

    def verb(name: str, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        sp.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        sp.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
        return sp

    sp = verb("init", "make a directory a new workspace")
    sp.add_argument("dir", nargs="?", default=".", help="the directory (default: here)")
    sp.add_argument("--store", help="store URL: file:///path (default: your data dir) or s3://bucket/prefix")

    sp = verb("snapshot", "publish the workspace's files as a new version")
    sp.add_argument("-m", "--message", default="", help="a note for the log")
    sp.add_argument("--force", action="store_true",
                    help="publish on top of a head that moved on since this copy's version")
    sp.add_argument("-C", dest="dir", default=".", help="the workspace directory (default: here)")

    sp = verb("log", "list the workspace's versions, newest first")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("status", "which workspace, store and version this copy is, and what is pending")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("restore", "materialize a version into a directory")
    sp.add_argument("dest", help="destination directory (empty, or a copy of the same workspace)")
    sp.add_argument("--store", required=True, help="store URL")
    sp.add_argument("--workspace", required=True, help="workspace id")
    sp.add_argument("--version", type=int, help="version (default: the latest)")
    sp.add_argument("--lazy", action="store_true", help="fetch large files in the background")
    sp.add_argument("--lazy-threshold", type=int, metavar="BYTES",
                    help="files at least this big are fetched lazily (default 64 MiB)")
    sp.add_argument("--delete", action="store_true",
                    help="remove files the version does not have (with --force, each is kept as NAME.orig-TIME)")
    sp.add_argument("--force", action="store_true",
                    help="restore into a folder that holds other files; each that differs is kept as NAME.orig-TIME")

    sp = verb("verify", "compare this copy byte for byte with a version and the store")
    sp.add_argument("--version", type=int, help="version (default: the one this copy is based on)")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("fetch", "fetch a file still pending from a lazy restore, now")
    sp.add_argument("path", help="workspace-relative path")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("checkpoint", "register a checkpoint: write check, upload, read-back, verified or rejected")
    sp.add_argument("path", help="a checkpoint file or directory inside the workspace")
    sp.add_argument("--step", type=int, help="the training step it was saved at")
    sp.add_argument("--note", default="", help="a note to keep with it")
    sp.add_argument("--settle", type=float, default=2.0, metavar="S",
                    help="seconds it must hold still before it is checked (default 2)")
    sp.add_argument("--timeout", type=float, default=30.0, metavar="S",
                    help="give up waiting for it to hold still after this long (default 30)")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("checkpoints", "list the registered checkpoints, oldest first")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("diff", "what changed between two versions: files, packages, driver, GPU")
    sp.add_argument("a", type=int, help="version A")
    sp.add_argument("b", type=int, help="version B")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("offers", "what the enabled providers list")
    sp.add_argument("--catalog", metavar="TOML", help="the local market's catalog (default: "
                    "$JUPYTER_PORTABLE_CATALOG, else the demo catalog; format in docs/catalog.md)")
    sp.add_argument("--gpu", help="only offers whose GPU model contains this")

    sp = verb("routes", "every offer as a route to this workspace, ranked by whole cost")
    sp.add_argument("--catalog", metavar="TOML", help="the local market's catalog (default: "
                    "$JUPYTER_PORTABLE_CATALOG, else the demo catalog; format in docs/catalog.md)")
    sp.add_argument("--hours", type=float, help="planned GPU hours (default: the workspace setting, 8)")
    sp.add_argument("--gpu", help="only offers whose GPU model contains this")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("settings", "show or change what this workspace needs and may spend (kept with it)")
    sp.add_argument("--gpu", action="append", dest="gpus", metavar="MODEL", help="acceptable GPU model (repeat)")
    sp.add_argument("--gpu-count", type=int)
    sp.add_argument("--min-gpu-memory", type=float, metavar="GB")
    sp.add_argument("--driver", help="pin an exact driver version ('' to unpin)")
    sp.add_argument("--min-cuda")
    sp.add_argument("--container-image", metavar="IMAGE", help="the container image RunPod, Vast.ai and the local "
                    "market start, such as nvcr.io/nvidia/pytorch:24.05-py3 ('' for each provider's default)")
    sp.add_argument("--machine-image", metavar="IMAGE", help="the image AWS or Google Cloud boots: an AMI "
                    "(ami-...) for AWS, projects/P/global/images/family/F for Google Cloud ('' for the default)")
    sp.add_argument("--image", help=argparse.SUPPRESS)  # two settings now: said so if given
    sp.add_argument("--region", action="append", dest="regions", metavar="REGION")
    sp.add_argument("--max-price", type=float, metavar="USD_PER_HOUR", help="cap on $/h")
    sp.add_argument("--budget", type=float, metavar="USD", help="total budget for this workspace")
    sp.add_argument("--hours", type=float, help="planned GPU hours for route costs")
    sp.add_argument("--autosnapshot", type=float, metavar="MINUTES",
                    help="the kernel on the machine snapshots this often (0: off)")
    sp.add_argument("--idle-minutes", type=float, metavar="MINUTES",
                    help="seal and release the machine after this long with no cell run and an idle GPU "
                         "(default 30; 0: never)")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("reserve", "book GPU time ahead for an offer type")
    sp.add_argument("--catalog", metavar="TOML", help="the local market's catalog (default: "
                    "$JUPYTER_PORTABLE_CATALOG, else the demo catalog; format in docs/catalog.md)")
    sp.add_argument("offer", help="provider/offer-id, as `offers` shows")
    sp.add_argument("--start", required=True, help="ISO time with a zone, on the hour: 2026-12-01T09:00Z")
    sp.add_argument("--hours", type=float, required=True)
    sp.add_argument("--charge", choices=("now", "before"), default="before",
                    help="charge at booking, or automatically 2 h before the start (default)")
    sp.add_argument("--quote", action="store_true",
                    help="show what the booking would cost and where the figure comes from; buy nothing")
    sp.add_argument("--max-price", type=float, metavar="DOLLARS",
                    help="the price you confirm for a slot the provider sells (an AWS Capacity Block: paid when "
                         "bought, final); without it such a booking is refused with its price")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("reservations", "list (or cancel) this workspace's reservations")
    sp.add_argument("--catalog", metavar="TOML", help="the local market's catalog (default: "
                    "$JUPYTER_PORTABLE_CATALOG, else the demo catalog; format in docs/catalog.md)")
    sp.add_argument("--cancel", metavar="ID", help="cancel this reservation")
    sp.add_argument("--calendar", type=int, metavar="DAYS", help="also show free and taken slots for DAYS days")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("spend", "what this workspace has spent and where its budget stands")
    sp.add_argument("--catalog", metavar="TOML", help="the local market's catalog (default: "
                    "$JUPYTER_PORTABLE_CATALOG, else the demo catalog; format in docs/catalog.md)")
    sp.add_argument("--enforce", action="store_true",
                    help="at the budget, seal the workspace and release its machines")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("machines", "every machine the enabled providers hold for jupyter-portable, and which are orphans")
    sp.add_argument("--orphans", action="store_true",
                    help="only the orphans: machines that are not the current allocation of a known workspace")
    sp.add_argument("--terminate", nargs="?", const="", metavar="ID",
                    help="terminate the machine ID (provider ref or allocation id); with --orphans and no ID, "
                         "every orphan")
    sp.add_argument("--catalog", metavar="TOML", help="the local market's catalog (default: "
                    "$JUPYTER_PORTABLE_CATALOG, else the demo catalog; format in docs/catalog.md)")
    sp.add_argument("-C", dest="dir", default=".", help="a workspace copy whose store says which workspaces are known")

    sp = verb("market", "the local market: let it take a machine back, or list its machines")
    sp.add_argument("--catalog", metavar="TOML", help="the local market's catalog (default: "
                    "$JUPYTER_PORTABLE_CATALOG, else the demo catalog; format in docs/catalog.md)")
    sp.add_argument("action", choices=("lose", "list"))
    sp.add_argument("allocation", nargs="?", help="allocation id (for lose)")

    sp = verb("continue", "put the workspace on a fresh, verified machine (the first one too)")
    sp.add_argument("--catalog", metavar="TOML", help="the local market's catalog (default: "
                    "$JUPYTER_PORTABLE_CATALOG, else the demo catalog; format in docs/catalog.md)")
    sp.add_argument("--route", metavar="ID", help="the route to try first (see `routes`); the best one otherwise")
    sp.add_argument("--hours", type=float, help="planned GPU hours for the route costs")
    sp.add_argument("--environment", choices=("auto", "exact", "lockfile", "image"),
                    help="the notebook's Python on the machine: auto (default: the recorded environment, the nearest "
                         "compatible versions where the machine's Python differs, each difference shown), exact "
                         "(refuse a machine where any recorded version does not fit), lockfile, or image (the "
                         "machine's own Python); default $JUPYTER_PORTABLE_ENVIRONMENT, else auto")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("stop", "seal the workspace on its machine (publish and read back), then release the machine")
    sp.add_argument("--catalog", metavar="TOML", help="the local market's catalog (default: "
                    "$JUPYTER_PORTABLE_CATALOG, else the demo catalog; format in docs/catalog.md)")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("state", "the workspace's machine: its state, and whether it still answers (detects a loss)")
    sp.add_argument("--catalog", metavar="TOML", help="the local market's catalog (default: "
                    "$JUPYTER_PORTABLE_CATALOG, else the demo catalog; format in docs/catalog.md)")
    sp.add_argument("--events", action="store_true", help="also list every state change")
    sp.add_argument("-C", dest="dir", default=".")

    sp = verb("fsck", "check the store: every version of every history can be restored; orphans and what no "
                      "version reaches are reported")
    sp.add_argument("--store", help="store URL (default: this workspace's)")
    sp.add_argument("--read-data", action="store_true",
                    help="also read every object back, as a restore reads it (hashes, lengths, packed ranges)")
    sp.add_argument("--read-data-subset", metavar="FRACTION",
                    help="re-hash only a random sample: 10%%, 1/10 or 0.1 (implies --read-data)")
    sp.add_argument("-C", dest="dir", default=".")
    return p


__all__ = ["build_parser"]
