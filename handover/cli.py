"""The `handover` command: render, verify and inspect runs outside pytest.

    handover report RUN_DIR [--sign-key KEY]       render (and sign) a run from its ledger
    handover verify RUN_DIR [--allowed-signers F]  check every signature and every file's digest
    handover inventory FILE [--json]               validate an inventory and list its nodes
    handover parse TOOL FILE                       a tool's saved output as JSON (sanity in `ok`)
    handover diff OLD_RUN NEW_RUN [--json]         what got worse or better from one run to another
    handover --version                             the version and commit runs record as their harness

Running the acceptance suites is pytest's job: pytest --inventory inventory/<cluster>.yaml
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from functools import cache
from pathlib import Path
from typing import Callable

EXIT_USAGE = 2
EXIT_SIGNER_UNCHECKED = 3  # verify: every file as signed, by a key no trust list of the caller's names
EXIT_PIPE_CLOSED = 128 + signal.SIGPIPE  # as a shell reports a command that `| head` cut short


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="handover", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action=_Version, help="the harness's version and commit, as runs record them")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    report = verbs.add_parser("report", help="render report.html, results.json, junit.xml from a run's ledger")
    report.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    report.add_argument("--sign-key", type=Path, metavar="KEY",
                        help="Ed25519 OpenSSH private key (default: this machine's handover key)")
    report.set_defaults(handler=cmd_report)

    verify = verbs.add_parser("verify", help="check the signatures and every file's SHA-256 in manifest.json "
                                             "(for a re-test, also its tie to the original run beside it); "
                                             "0: as signed by a key you trust, 1: a problem, 3: as signed, "
                                             "but by a key no --allowed-signers was given to check")
    verify.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    verify.add_argument("--allowed-signers", type=Path, metavar="FILE",
                        help="OpenSSH allowed_signers file of keys you trust, obtained apart from the run "
                             "(the run directory's own proves nothing)")
    verify.set_defaults(handler=cmd_verify)

    inventory = verbs.add_parser("inventory", help="validate an inventory and list its nodes, where each "
                                                   "came from and how it is reached")
    inventory.add_argument("file", type=Path, metavar="FILE")
    inventory.add_argument("--json", action="store_true",
                           help='print {"nodes": [{"name", "address", "port", "user", "identity_file", '
                                '"source", "rack", "leaf"}, ...]} for scripts')
    inventory.set_defaults(handler=cmd_inventory)

    parse = verbs.add_parser("parse", help="parse a saved tool output into JSON on stdout")
    # Naming the tools imports every runners module, a few tenths of a second that only this
    # verb's own help and use need (the verb comes first: the command has no global options).
    tool_help = ("one of: " + ", ".join(sorted(tool_parsers())) if argv[:1] == ["parse"]
                 else "the tool that wrote FILE")
    parse.add_argument("tool", metavar="TOOL", help=tool_help)
    parse.add_argument("file", type=Path, metavar="FILE")
    parse.set_defaults(handler=cmd_parse)

    diff = verbs.add_parser(
        "diff", help="compare two runs: new failures, fixed checks and nodes, moved metrics, nodes added or missing",
        description="Compare two run directories (their results.json, or their ledgers when it is missing) check "
                    "by check. Exit status: 0 when nothing got worse, 1 when something did (the verdict fell, a "
                    "check fails that did not, a node failed or is missing, a metric left its band or moved by "
                    "more than --threshold on its bad side), 2 when a run cannot be read.")
    diff.add_argument("old_run", type=Path, metavar="OLD_RUN")
    diff.add_argument("new_run", type=Path, metavar="NEW_RUN")
    diff.add_argument("--threshold", type=_fraction, default=0.1, metavar="FRACTION",
                      help="a metric that moved by more than this fraction of its old value is listed (default 0.1)")
    diff.add_argument("--json", action="store_true", help="print the differences as one JSON document, for scripts")
    diff.set_defaults(handler=cmd_diff)

    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except BrokenPipeError:
        # The reader went away (`handover inventory big.yaml | head`): stop quietly, as cat
        # does, and keep Python's exit-time flush of the dead pipe from printing a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED


class _Version(argparse.Action):
    """`handover --version`: the harness identity a run records (results.json's harness), read
    only when asked (a git call and the session's imports)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from handover.session import harness_identity

        identity = harness_identity()
        commit = f" (commit {identity['commit']})" if identity["commit"] else ""
        print(f"handover {identity['version']}{commit}")  # on stdout, as argparse's own version action
        parser.exit()


def fail(message: str) -> int:
    print(f"handover: {message}", file=sys.stderr)
    return EXIT_USAGE


def cmd_report(args) -> int:
    from reports.render import cycles_collected_after

    # The one collection comes after _report has dropped the run's millions of objects: collected
    # while they were alive, it walked them all for nothing (a quarter second at 1,024 nodes).
    with cycles_collected_after():
        return _report(args)


def _report(args) -> int:
    from reports import signing
    from reports.files import WriteError
    from reports.ledger import LEDGER_FILE, Ledger, LedgerError, RunDirectoryBusy, read_ledger, torn_warning
    from reports.render import render_run
    from reports.schema import SchemaError
    from reports.verdict import terminal_summary

    try:
        Ledger.held(args.run_dir)  # the run, or a resume of it, may still be writing there
    except RunDirectoryBusy as error:
        return fail(str(error))
    try:
        record = read_ledger(args.run_dir)  # not a run directory: say so before a key is created
        warning = torn_warning(record)
        if warning:
            print(f"handover: {warning}", file=sys.stderr)
        key = (signing.load_signing_key(args.sign_key) if args.sign_key
               else signing.ensure_default_key()[0])
        rendered = render_run(args.run_dir, key, record)
    except (LedgerError, signing.SigningError, WriteError) as error:
        return fail(str(error))
    except SchemaError as error:  # an entry the harness did not write: the ledger was edited
        return fail(f"{args.run_dir / LEDGER_FILE} makes no valid results: {error}")
    print(f"verdict: {rendered.verdict.headline}")
    for line in terminal_summary(rendered.verdict):
        print(line)
    print(f"report: {rendered.report}")
    print(f"signed by {key.fingerprint}")
    return 0


def cmd_verify(args) -> int:
    """One line per signature and per file that changed, went missing or was added (and for a
    re-test, one on its tie to the original run); who signed."""
    from reports.bundle import printable
    from reports.files import read_regular
    from reports.verify import verify_run

    try:
        os.listdir(args.run_dir)
    except FileNotFoundError:
        return fail(f"{args.run_dir}: no such run directory")
    except NotADirectoryError:
        return fail(f"{args.run_dir}: not a directory; give the run directory")
    except OSError as error:
        return fail(f"{args.run_dir}: cannot read: {error.strerror or error}")
    if args.allowed_signers:
        try:
            read_regular(args.allowed_signers)
        except FileNotFoundError:
            return fail(f"{args.allowed_signers}: no such allowed_signers file")
        except OSError as error:
            return fail(f"{args.allowed_signers}: cannot read: {error.strerror or error}")
    check = verify_run(args.run_dir, args.allowed_signers)
    for finding in check.findings:
        print(finding)
    if check.subject:
        print(printable(check.subject))
    if check.signer:
        print(printable(check.signer))
    if not check.ok:
        print(f"handover: {args.run_dir}: {len(check.problems)} problem(s); do not trust this run's files",
              file=sys.stderr)
        return 1
    if not check.trusted:
        print(f"handover: {args.run_dir}: every file is as signed, but the signer is not checked against "
              "keys you trust: pass --allowed-signers with the operator's key, obtained apart from the run",
              file=sys.stderr)
        return EXIT_SIGNER_UNCHECKED
    return 0


def cmd_inventory(args) -> int:
    import json

    from inventory.loader import InventoryError, load_inventory
    from reports.hostlists import counted, hostlist_of

    try:
        cluster = load_inventory(args.file)
    except InventoryError as error:
        return fail(str(error))
    if args.json:
        # A public interface: these keys, this shape; ssh's defaults are null.
        nodes = [{"name": node.name, "address": node.address, "port": node.ssh.port, "user": node.ssh.user,
                  "identity_file": node.ssh.identity_file, "rack": node.rack, "leaf": node.leaf,
                  "source": node.source} for node in cluster.nodes]
        print(json.dumps({"nodes": nodes}, indent=2))
        return 0
    names = [node.name for node in cluster.nodes]
    print(f"cluster {cluster.name}: {len(names)} node(s) {hostlist_of(names)}")
    print(f"profile {cluster.profile.name}: {cluster.profile.description}")
    print(f"transport {cluster.transport}")
    for group, members in cluster.groups.items():
        print(f"group {group}: {hostlist_of(members)}")
    for scratch in cluster.scratch:
        print(f"scratch {scratch.path} ({scratch.kind}{', destructive' if scratch.destructive else ''})")
    for reach, names in _reached_alike(cluster.nodes).items():
        if len(names) == 1:
            print(f"node {names[0]}: {reach.replace(OWN_NAME, names[0])}")
        else:
            print(f"nodes {counted(names)}: "
                  f"{reach.replace(OWN_NAME, 'its own name')}")
    return 0


OWN_NAME = "\0"  # stands for a node's own name where that is its address


def _reached_alike(nodes) -> dict[str, list[str]]:
    """How nodes are reached -> the nodes reached so but for their own name, in listed order:
    1,024 nodes from one hostlist are one line, not 1,024."""
    alike: dict[str, list[str]] = {}
    for node in nodes:
        if node.transport == "local":
            reach = f"this machine; from {node.source}"
        else:
            address = OWN_NAME if node.address == node.name else node.address
            placed = "".join(f", {key} {value}" for key, value in (("rack", node.rack), ("leaf", node.leaf)) if value)
            reach = (f"address {address}, user {node.ssh.user or '(ssh default)'}, "
                     f"port {node.ssh.port or '(ssh default)'}{placed}; from {node.source}")
        alike.setdefault(reach, []).append(node.name)
    return alike


@cache
def tool_parsers() -> dict:
    """TOOL -> parser, gathered from every runners module's PARSERS mapping.

    A tool module registers itself by defining PARSERS = {"fio": parse_fio}; each parser is
    pure (text in, result out) and raises ParseError for text that is not the tool's output.
    """
    import importlib
    import pkgutil

    import runners

    found: dict[str, Callable[[str], object]] = {}
    for module in pkgutil.iter_modules(runners.__path__):
        found.update(getattr(importlib.import_module(f"runners.{module.name}"), "PARSERS", {}))
    return found


def cmd_parse(args) -> int:
    import dataclasses
    import json

    from runners.parsing import ParseError

    parsers = tool_parsers()
    if args.tool not in parsers:
        return fail(f"parse: unknown tool {args.tool!r}; known: {', '.join(sorted(parsers))}")
    try:
        text = args.file.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        return fail(f"{args.file}: {error.strerror}")
    try:
        parsed = parsers[args.tool](text)
    except ParseError as error:
        return fail(f"{args.file}: not {args.tool} output: {error}")
    result = parsed
    if dataclasses.is_dataclass(parsed) and not isinstance(parsed, type):
        result = dataclasses.asdict(parsed)
    print(json.dumps(result, indent=2))
    return 0


def _fraction(value: str) -> float:
    """--threshold: a positive fraction such as 0.1 (10%)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.1, got {value!r}") from None
    if not 0 < number < float("inf"):
        raise argparse.ArgumentTypeError(f"must be above 0, got {value!r}")
    return number


def cmd_diff(args) -> int:
    import json

    from reports.diff import DiffError, diff_runs, load_run, render_text
    from reports.verdict import FLEET_NODES

    try:
        old, new = load_run(args.old_run), load_run(args.new_run)
    except DiffError as error:
        return fail(str(error))
    found = diff_runs(old, new, args.threshold)
    fleet = len((new.get("run") or {}).get("nodes") or []) > FLEET_NODES
    print(json.dumps(found, indent=2) if args.json else render_text(found, fleet), end="\n" if args.json else "")
    return 1 if found["worse"] else 0


if __name__ == "__main__":
    sys.exit(main())
