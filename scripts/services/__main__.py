"""``python -m scripts.services up [--quiet] [SVC...] | down [SVC...] | status | env | purge``

Exit codes: 0 done; 1 a service could not be installed, started or stopped (one line says
why); 2 a usage error (an unknown command or service, a bad SERVICES_PORT_BASE).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from scripts.services.host import ServiceError
from scripts.services.orchestrator import Orchestrator, dev_services
from scripts.services.plan import Layout, PlanError, PortPlan, port_base

CHECKOUT = Path(__file__).resolve().parents[2]
EXIT_FAILURE = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"services: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m scripts.services",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    up = commands.add_parser("up", help="start what is missing, write .services/env")
    up.add_argument("--quiet", action="store_true", help="say only what fails")
    up.add_argument("services", nargs="*", metavar="SVC")
    down = commands.add_parser("down", help="stop this checkout's services")
    down.add_argument("services", nargs="*", metavar="SVC")
    commands.add_parser("status", help="one line per service")
    commands.add_parser("env", help="print .services/env")
    commands.add_parser("purge", help="stop everything and remove all service state")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quiet = getattr(args, "quiet", False)
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="services: %(message)s",
        stream=sys.stderr,
    )
    try:
        ports = PortPlan(port_base(os.environ))
    except PlanError as exc:
        print(f"services: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    layout = Layout.for_checkout(CHECKOUT)
    orchestrator = Orchestrator(layout, dev_services(layout, ports))
    names = getattr(args, "services", [])
    try:
        orchestrator.resolve(names, with_needs=False)
    except KeyError as exc:
        print(f"services: error: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "up":
            orchestrator.up(names)
        elif args.command == "down":
            orchestrator.down(names)
        elif args.command == "status":
            print("\n".join(orchestrator.status()))
        elif args.command == "env":
            if not orchestrator.env_file.exists():
                raise ServiceError(f"{orchestrator.env_file} not found: run up first")
            print(orchestrator.env_file.read_text(), end="")
        else:
            orchestrator.purge()
    except ServiceError as exc:
        print(f"services: ERROR: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


if __name__ == "__main__":
    sys.exit(main())
