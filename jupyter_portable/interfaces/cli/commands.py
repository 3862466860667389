"""``jupyter portable <verb>``: parses arguments, calls :class:`Workspace`, prints.

With ``--json`` each verb prints one JSON object on stdout. Progress goes to stderr.
A failure exits non-zero with a one-line reason on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from jupyter_portable.core.errors import PortableError, UsageError
from jupyter_portable.core.validate import terminal_safe
from jupyter_portable.interfaces.cli.parser import build_parser

EXIT_FAIL = 1
EXIT_USAGE = 2
Answer = tuple[dict[str, Any], str, int]  # a verb's JSON, its human text, the exit status


def _stream(args: argparse.Namespace) -> Any:
    return None if args.quiet else sys.stderr


def _run(args: argparse.Namespace) -> Answer:
    """Do the verb (its row of :data:`VERBS`); return its JSON, its human text and the exit status."""
    if getattr(args, "catalog", None):
        import os

        if not os.path.isfile(args.catalog):
            raise UsageError(f"--catalog {args.catalog}: no such file")
    verb = VERBS.get(args.verb)
    if verb is None:
        raise UsageError("no verb given; try `jupyter portable --help`")
    if not verb.workspace:
        return verb.run(args)
    from jupyter_portable.engine.workspace import Workspace

    return verb.run(args, Workspace.find(args.dir))


def _init(args: argparse.Namespace) -> Answer:
    """``init``: make a directory a new workspace."""
    from jupyter_portable.engine.workspace import Workspace

    ws = Workspace.init(args.dir, args.store)
    cfg = ws.config
    warnings = ws.store.backend.durability_warnings()
    for line in warnings:  # on stderr in both modes: --json readers get them in the object too
        print(f"warning: {terminal_safe(line, one_line=True)}", file=sys.stderr)
    made = {"workspace_id": cfg.workspace_id, "store": cfg.store, "path": str(ws.root), "warnings": warnings}
    return made, f"initialized workspace {cfg.workspace_id} in {cfg.store}", 0


def _restore(args: argparse.Namespace) -> Answer:
    """``restore``: materialize a version into a directory."""
    from jupyter_portable.core.times import utcnow
    from jupyter_portable.engine.workspace import Workspace

    restored = Workspace.restore(args.store, args.workspace, args.dest, version=args.version,
                                 lazy=args.lazy, lazy_threshold=args.lazy_threshold,
                                 delete=args.delete, progress=_stream(args), force=args.force,
                                 now=utcnow())  # the one clock read: it names kept files
    text = "\n".join(f"kept {path} as {aside}" for path, aside in sorted(restored.kept.items()))
    for r in restored.refused:  # on stderr in both modes: --json readers get them in the object too
        print(f"refused {terminal_safe(r['path'], one_line=True)}: {r['reason']}", file=sys.stderr)
    return restored.to_json(), text, 0


def _fsck(args: argparse.Namespace) -> Answer:
    """``fsck``: check a store's objects and versions."""
    from jupyter_portable.engine.verify import parse_subset
    from jupyter_portable.engine.workspace import Workspace, fsck_store

    url = args.store or Workspace.find(args.dir).config.store
    subset = parse_subset(args.read_data_subset)
    checked = fsck_store(url, read_data=args.read_data or subset is not None, subset=subset)
    return checked.to_json(), "\n".join(checked.lines()), 0 if checked.ok else EXIT_FAIL


def _spend(args: argparse.Namespace, ws: Any) -> Answer:
    """``spend``: the workspace's spend against its budget (``--enforce`` acts on it)."""
    from jupyter_portable.orchestration import budget

    config = _config(args)
    providers = config.make_providers()
    # bookings hold money back by the calendar's clock (c.Portable.now), as the server's do
    report = (budget.enforce_budget(ws, providers=providers, calendar_now=config.clock()()) if args.enforce
              else budget.budget_report(ws, providers=providers, calendar_now=config.clock()()))
    text = report["message"] + (f" (measured by the providers ${report['measured']:,.2f}, estimated "
                                f"${report['estimated']:,.2f})" if "measured" in report else "")
    return report, text, 0


def _snapshot(args: argparse.Namespace, ws: Any) -> Answer:
    """``snapshot``: publish the copy's files as a new version."""
    snap = ws.snapshot(args.message, force=args.force, progress=_stream(args))
    return snap.to_json(), "", 0


def _log(args: argparse.Namespace, ws: Any) -> Answer:
    """``log``: the workspace's versions, newest first."""
    versions = ws.log()
    # a message is one line of the table, whatever a worker or an old version wrote into it
    text = "\n".join(f"{v['version']:>5}  {v['created']}  {v['files']:>7} files  {v['bytes']:>14} B  "
                     f"{terminal_safe(str(v['message']), one_line=True)}" for v in versions) or "no versions yet"
    return {"workspace_id": ws.workspace_id, "versions": versions}, text, 0


def _status(args: argparse.Namespace, ws: Any) -> Answer:
    """``status``: which workspace, store and version this copy is, and what is pending."""
    from jupyter_portable.interfaces.report import format_status

    st = _at_head(ws, ws.status())
    return st, format_status(st), 0


def _verify(args: argparse.Namespace, ws: Any) -> Answer:
    """``verify``: the copy's files against a version."""
    verified = ws.verify(args.version)
    text = (f"ok: {verified.files} files match version {verified.version}" if verified.ok else
            f"MISMATCH against version {verified.version}:\n"
            + "\n".join(f"  {m['path']}: {m['reason']}" for m in verified.mismatches))
    return verified.to_json(), text, 0 if verified.ok else EXIT_FAIL


def _checkpoint(args: argparse.Namespace, ws: Any) -> Answer:
    """``checkpoint``: register a file once it passes its write check."""
    if args.settle < 0 or args.timeout <= 0:
        raise UsageError("--settle must be >= 0 and --timeout > 0")
    import os

    path = args.path if os.path.isabs(args.path) else os.path.join(os.getcwd(), args.path)
    rec = ws.checkpoint(path, step=args.step, note=args.note, quiet_s=args.settle, timeout_s=args.timeout,
                        progress=_stream(args))
    out = {"path": rec.path, "step": rec.step, "status": rec.status, "reason": rec.reason,
           "hash": rec.hash, "version": rec.version, "format": rec.format}
    text = (f"verified: {rec.path} in version {rec.version}" if rec.verified
            else f"REJECTED: {rec.path}: {rec.reason}")
    return out, text, 0 if rec.verified else EXIT_FAIL


def _checkpoints(args: argparse.Namespace, ws: Any) -> Answer:
    """``checkpoints``: the head's checkpoints."""
    from jupyter_portable.engine.checkpoint.registry import latest as latest_of
    from jupyter_portable.engine.checkpoint.registry import records
    from jupyter_portable.interfaces.report import format_checkpoints

    # issue 16: the head's checkpoints (a worker may have published since this copy's version)
    head = ws.store.read_head(ws.workspace_id)[0].version
    manifest = ws.manifest(head) if head else None
    recs, latest = records(manifest), latest_of(manifest)
    copy_version = ws.config.version
    return ({"checkpoints": [r.to_json() for r in recs], "latest": latest.to_json() if latest else None,
             "version": head, "copy_version": copy_version},
            format_checkpoints(recs, version=head, copy_version=copy_version), 0)


def _diff(args: argparse.Namespace, ws: Any) -> Answer:
    """``diff``: what changed between two versions."""
    d = ws.diff(args.a, args.b)
    return d, ws.format_diff(d), 0


def _fetch(args: argparse.Namespace, ws: Any) -> Answer:
    """``fetch``: a pending large file, now."""
    ws.fetch(args.path)
    return {"path": args.path, "fetched": True}, f"{args.path} is in place", 0


def _at_head(ws: Any, st: dict[str, Any]) -> dict[str, Any]:
    """Issue 16: status describes the head (what a worker last published), naming this copy's own
    version beside it; ``version`` stays this copy's, ``latest_checkpoint`` becomes the head's."""
    from jupyter_portable.engine.checkpoint.registry import latest

    head = st.get("head_version") or 0
    out = {**st, "copy_version": st.get("version"), "copy_latest_checkpoint": st.get("latest_checkpoint")}
    if head and head != st.get("version"):
        best = latest(ws.manifest(head))
        out["latest_checkpoint"] = None if best is None else \
            {"path": best.path, "step": best.step, "hash": best.hash, "version": best.version}
    return out


def _config(args: argparse.Namespace) -> Any:
    """``c.Portable`` from the Jupyter config files and the environment; ``--catalog`` wins."""
    import os

    from jupyter_portable.interfaces.config import Portable, load_config

    if getattr(args, "catalog", None):
        return Portable(config=load_config(), catalog=os.path.abspath(args.catalog))
    return Portable(config=load_config())


def _orchestrator(args: argparse.Namespace, ws: Any, config: Any = None) -> Any:
    """An Orchestrator of ``ws`` with c.Portable's settings (``config``, else read), its moves and
    progress on stderr."""
    from jupyter_portable.orchestration.orchestrator import Orchestrator

    def on_state(ev: dict[str, Any]) -> None:
        if not args.quiet:
            why = f": {ev['reason']}" if ev.get("reason") else ""
            print(terminal_safe(f"[{ev['state']}] {ev.get('allocation_id') or ''}{why}".rstrip(), one_line=True),
                  file=sys.stderr)

    def on_progress(ev: dict[str, Any]) -> None:
        if not args.quiet:
            print(terminal_safe(f"  {ev['step']}: {ev['message']}", one_line=True), file=sys.stderr)

    config = config if config is not None else _config(args)
    mode = getattr(args, "environment", None) or config.environment
    return Orchestrator(ws, on_state=on_state, on_progress=on_progress, providers=config.make_providers(),
                        environment={"mode": mode}, pass_env=config.pass_env, boot_timeout=config.boot_timeout)


def _continue(args: argparse.Namespace, ws: Any) -> Answer:
    """``continue``: the workspace on a fresh, verified machine."""
    orch = _orchestrator(args, ws)
    try:
        out = orch.continue_(args.route, hours=args.hours)
    finally:
        orch.close()
    env = out.get("environment") or {}
    return out, (f"{out['state']} on {out['allocation_id']} (route {out['route']}), version {out['version']}, "
                 "verified" + (f"\nenvironment: {env['summary']}" if env.get("summary") else "")), 0


def _stop(args: argparse.Namespace, ws: Any) -> Answer:
    """``stop``: seal, read back, release."""
    orch = _orchestrator(args, ws)
    try:
        out = orch.stop()
    finally:
        orch.close()
    return out, f"sealed version {out['sealed_version']} and released the machine", 0


def _state(args: argparse.Namespace, ws: Any) -> Answer:
    """``state``: the workspace's state and machine in the words every view uses, and the budget."""
    config = _config(args)
    orch = _orchestrator(args, ws, config)
    try:
        from jupyter_portable.core.reachability import since_text
        from jupyter_portable.core.state_words import safe_version, state_line, unreachable_line
        from jupyter_portable.core.times import parse_iso_or_none

        out = orch.check()
        alive = {True: "answering", False: "not answering", None: "no machine"}[out["alive"]]
        # the state in the words every view uses (core/state_words.py), then the machine
        aid = out["allocation_id"]
        machine = (alive if not aid else f"{aid}, {alive}" if out["alive"] is not None
                   else f"{alive}; the last was {aid}")
        since = parse_iso_or_none(out.get("unreachable_since"))
        # the version the sidebar says the workspace is safe at: the newest published (a machine
        # publishes past the version the lifecycle last recorded), one rule (core/state_words.py)
        head, _ = ws.store.read_head(ws.workspace_id)
        out["safe_version"] = version = safe_version(out["version"], head.version)
        out["line"] = state_line(out["state"], version)
        text = (f"{unreachable_line(out['state'], version, since_text(since))} ({machine})" if since
                else f"{out['line']} ({machine})")
        from jupyter_portable.orchestration.idle import idle_release

        released = idle_release(orch.lifecycle())  # an idle stop, here or by the machine while this side was away
        if released is not None:
            out["released"] = released
            text += f"\n{released['message']}"
        from jupyter_portable.orchestration.budget import budget_report

        # the budget as `spend` and the sidebar say it (one report: orchestration/budget.py)
        try:
            out["budget"] = budget_report(ws, providers=orch.providers, calendar_now=config.clock()())
        except PortableError as exc:  # the machine's state still said; the budget says why not
            out["budget"] = {"state": "unknown", "message": f"unknown: {exc.one_line()}"}
        text += f"\nbudget: {out['budget']['message']}"
        if args.events:
            events = orch.lifecycle().events
            out["events"] = [e.to_json() for e in events]
            # one line each, oldest first: "#3 2026-11-02T09:00:00Z IDLE -> ROUTING al-... v4: reason"
            text += "".join(
                f"\n#{e.seq} {e.at} {e.previous or '-'} -> {e.state}"
                + (f" {e.allocation_id}" if e.allocation_id else "") + (f" v{e.version}" if e.version else "")
                + (f": {e.reason}" if e.reason else "") for e in events) or "\nno events"
        return out, text, 0
    finally:
        orch.close()


def _offers(args: argparse.Namespace) -> Answer:
    """``offers``: what every enabled provider lists now."""
    from jupyter_portable.orchestration.routes import list_offers

    config = _config(args)
    offers, errors = list_offers(config.make_providers(), gpu=args.gpu)
    rows = [f"{o.key:<28} {o.gpu_count} x {o.gpu:<24} {o.gpu_memory_gb:>5g} GB  ${o.price_per_hour:>6.2f}/h  "
            f"{o.region:<12} driver {o.driver or '?':<10} capacity {o.capacity if o.capacity is not None else '?'}"
            for o in offers]
    rows += [f"({name}: {err})" for name, err in errors.items()]
    failed = bool(errors) and not offers  # no provider answered: that is a failure, not "no offers"
    return ({"offers": [o.to_json() for o in offers], "errors": errors},
            ("no provider answered: " + "; ".join(f"{n}: {e}" for n, e in errors.items())) if failed
            else "\n".join(rows) or "no offers", EXIT_FAIL if failed else 0)


def _market(args: argparse.Namespace) -> Answer:
    """``market``: the local market's machines (``list``), or one taken back (``lose``)."""
    config = _config(args)
    from jupyter_portable.demo.market import LocalMarket, lose_allocation

    local = LocalMarket(config.catalog, config.market_dir)
    if args.action == "list":
        allocs = local.list_allocations()
        return ({"allocations": allocs},
                "\n".join(f"{a.get('allocation_id')}  {a.get('offer_id')}  {a.get('state')}" for a in allocs)
                or "no machines", 0)
    if not args.allocation:
        raise UsageError("market lose needs an ALLOCATION id (see `jupyter portable market list`)")
    lose_allocation(local.state_dir, args.allocation)
    return ({"allocation_id": args.allocation, "state": "lost"},
            f"the market took {args.allocation} back", 0)


def _routes(args: argparse.Namespace, ws: Any) -> Answer:
    """``routes``: every route to a machine, ranked, with its cost's parts."""
    from jupyter_portable.orchestration import routes as routing

    config = _config(args)
    providers, clock = config.make_providers(), config.clock()
    routes, errors = routing.compute_routes(ws, hours=args.hours, gpu=args.gpu, providers=providers,
                                            calendar_now=clock())
    lines = []
    for i, r in enumerate(routes, 1):
        c = r.cost
        head = (f"{i:>2}. {r.offer.key:<28} {r.offer.gpu_count} x {r.offer.gpu:<22} total ${c.total:>8.2f}  "
                f"(gpu {c.gpu:.2f}, egress {c.egress:.2f}, storage {c.storage:.2f}, queue {c.queue:.2f}, "
                f"risk {c.risk:.2f})  ready in {r.time_to_ready_s:.0f} s")
        lines.append(head + (f"\n      BLOCKED: {r.blocked}" if r.blocked else ""))
    lines += [f"({name}: {err})" for name, err in errors.items()]
    return {"routes": [r.to_json() for r in routes], "errors": errors}, "\n".join(lines) or "no routes", 0


def _settings(args: argparse.Namespace, ws: Any) -> Answer:
    """``settings``: what the workspace needs and may spend; the options given change it."""
    from jupyter_portable.orchestration import settings as workspace_settings

    config = _config(args)
    providers, clock = config.make_providers(), config.clock()
    changes = {"gpus": args.gpus, "gpu_count": args.gpu_count, "min_gpu_memory_gb": args.min_gpu_memory,
               "driver": args.driver, "min_cuda": args.min_cuda, "container_image": args.container_image,
               "machine_image": args.machine_image, "regions": args.regions,
               "budget_max_price_per_hour": args.max_price, "budget_total": args.budget, "hours": args.hours,
               "autosnapshot_minutes": args.autosnapshot, "idle_minutes": args.idle_minutes}
    if args.image is not None:
        changes["image"] = args.image  # refused, saying which two settings took its place
    if any(v is not None for v in changes.values()):
        settings = workspace_settings.update_settings(ws, **changes)
    else:
        settings = workspace_settings.load_settings(ws)
    shown = settings.to_json()
    from jupyter_portable.orchestration.budget import budget_report

    standing = budget_report(ws, providers=providers, calendar_now=clock())
    shown.update(spent=standing["spent"], committed=standing["committed"], left=standing["left"])
    return shown, json.dumps(shown, indent=2), 0


def _reserve(args: argparse.Namespace, ws: Any) -> Answer:
    """``reserve``: book an offer for a slot (``--quote``: its price, nothing bought)."""
    from jupyter_portable.orchestration import reservations

    config = _config(args)
    providers, clock = config.make_providers(), config.clock()
    if args.quote:
        shown = reservations.quote(ws, args.offer, args.start, args.hours, providers=providers, now=clock())
        return shown, (f"{shown['offer']} from {shown['start']} for {shown['hours']:g} h: {shown['currency']} "
                       f"{shown['price']:,.2f} ({shown['price_source']}); nothing was bought"), 0
    booking = reservations.reserve(ws, args.offer, args.start, args.hours, args.charge, providers=providers,
                                   now=clock(), max_price=args.max_price)
    b = booking.to_json()
    return b, (f"booked {b['reservation_id']}: {b['offer_key']} from {b['start']} for {b['hours']:g} h, "
               f"${b['price']:.2f}, charged {'now' if b['charge'] == 'now' else 'at ' + b['charge_at']}; "
               f"guarantee: {b['guarantee']}"), 0


def _reservations(args: argparse.Namespace, ws: Any) -> Answer:
    """``reservations``: the workspace's bookings (``--cancel`` one; ``--calendar`` an offer's slots)."""
    from jupyter_portable.orchestration import reservations

    config = _config(args)
    providers, clock = config.make_providers(), config.clock()
    if args.cancel:
        booking = reservations.cancel_reservation(ws, args.cancel, providers=providers, now=clock())
        return booking.to_json(), f"cancelled {booking.reservation_id}", 0
    books = reservations.reservations(ws)
    out: dict[str, Any] = {"reservations": [b.to_json() for b in books]}
    if args.calendar:
        out["calendar"] = reservations.calendar(ws, args.calendar, providers=providers, now=clock())
    text = "\n".join(f"{b.reservation_id}  {b.offer_key:<26} {b.start.isoformat()}  {b.hours:g} h  ${b.price:.2f}  "
                     f"{b.status:<9} {b.guarantee}  charge {b.charge}" for b in books) or "no reservations"
    return out, text, 0


def _machines(args: argparse.Namespace) -> Answer:
    """``machines``: list (or terminate) what the providers hold with our labels."""
    from jupyter_portable.engine.workspace import Workspace
    from jupyter_portable.orchestration import machines

    if args.terminate == "" and not args.orphans:
        raise UsageError("--terminate needs a machine id, or --orphans to terminate every orphan")
    providers = _config(args).make_providers()
    copies = []
    with contextlib.suppress(PortableError):
        copies.append(Workspace.find(args.dir))
    if args.terminate:
        done = machines.terminate(providers, args.terminate)
        return done, f"terminated {done['provider']}/{done['ref']} (the provider says: {done['state']})", 0
    if args.terminate == "":
        out = machines.terminate_orphans(providers, copies)
        lines = [f"terminated {d['provider']}/{d['ref']} ({d['allocation_id']}, workspace {d['workspace_id']}): "
                 f"{d['state']}" for d in out["terminated"]] or ["no orphans"]
    else:
        out = machines.machines_report(providers, copies)
        rows = out["orphans"] if args.orphans else out["machines"]
        lines = [f"{r['provider']}/{r['ref']:<14} {r['allocation_id'] or '-':<16} {r['workspace_id'] or '-':<26} "
                 f"{r['state']:<10} {_uptime(r['uptime_s']):>8} "
                 f"{_dollars(r['spend']):>8} "
                 f"{'ORPHAN' if r['orphan'] else '' if r['orphan'] is False else 'not judged'}  {r['why']}"
                 for r in rows]
        listing = sorted(set(providers) - set(out["unlisted"]))
        if not rows:
            lines = ["no orphans" if args.orphans else f"no machines listed by {', '.join(listing)}" if listing
                     else "no enabled provider lists its machines here"]
        # a provider that cannot list its machines is said, never taken for one that has none (issue 43)
        lines += [f"{name}: cannot list its machines here"
                  + ("; `jupyter portable market list` shows the local market's" if name == "local" else "")
                  for name in out["unlisted"]]
        if args.orphans:
            out = {**out, "machines": out["orphans"]}
    lines += [f"warning: {p}" for p in out["problems"]]
    return out, "\n".join(lines), EXIT_FAIL if out.get("problems") and args.terminate == "" else 0


def _dollars(amount: float | None) -> str:
    return "?" if amount is None else f"${amount:.2f}"


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m"


class Verb(NamedTuple):
    """One verb: the function that does it, and whether it acts on the workspace found from ``-C``
    (then it is called with it)."""

    run: Callable[..., Answer]
    workspace: bool


# every verb of `jupyter portable`, as the server's routes are one table (its arguments: cli/parser.py)
VERBS: dict[str, Verb] = {
    "init": Verb(_init, False), "restore": Verb(_restore, False), "fsck": Verb(_fsck, False),
    "offers": Verb(_offers, False), "market": Verb(_market, False), "machines": Verb(_machines, False),
    "spend": Verb(_spend, True), "routes": Verb(_routes, True), "settings": Verb(_settings, True),
    "reserve": Verb(_reserve, True), "reservations": Verb(_reservations, True),
    "continue": Verb(_continue, True), "stop": Verb(_stop, True), "state": Verb(_state, True),
    "snapshot": Verb(_snapshot, True), "log": Verb(_log, True), "status": Verb(_status, True),
    "verify": Verb(_verify, True), "checkpoint": Verb(_checkpoint, True), "checkpoints": Verb(_checkpoints, True),
    "diff": Verb(_diff, True), "fetch": Verb(_fetch, True),
}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.help_all:
            from jupyter_portable.interfaces.config import help_all

            parser.print_help()
            print("\nSettings (c.Portable.NAME, and c.PortableRunPod.NAME and the like for each provider, in "
                  "jupyter_server_config.py; an environment variable, where a setting names one, is its default, "
                  "which a file's value wins over; API keys and credentials are never settings: they stay in the "
                  "environment or the provider's credential files, docs/configuration.md):\n")
            print(help_all())
            return 0
        if not args.verb:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        out, text, code = _run(args)
    except UsageError as exc:
        print(f"error: {terminal_safe(exc.one_line(), one_line=True)}", file=sys.stderr)
        return EXIT_USAGE
    except PortableError as exc:
        print(f"error: {terminal_safe(exc.one_line(), one_line=True)}", file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:
        print("error: interrupted; nothing was published", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return EXIT_FAIL
    if args.json:
        print(json.dumps(out))
        if code != 0 and text:
            print(f"error: {terminal_safe(text.splitlines()[0], one_line=True)}", file=sys.stderr)
    elif text:
        # what a store, a worker or a provider said reaches a terminal here: nothing in it acts on it
        print(terminal_safe(text))
    return code

