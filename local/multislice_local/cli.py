"""`multislice-local`: the local default's entry points (demo, cluster, GKE simulator)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="multislice-local",
        description="Local tooling: a simulated GKE multislice cluster on this machine.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "demo", help="the local default: a simulated GKE multislice cluster, narrated end to end"
    )
    from multislice_local.demo import add_arguments, run_demo

    add_arguments(p)
    p.set_defaults(func=run_demo)
    p = sub.add_parser(
        "image",
        help="the operator and workload images, built offline into OCI archives (no registry)",
    )
    from multislice_local import images

    images.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
