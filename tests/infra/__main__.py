"""`python -m tests.infra up|down|status [--components kafka,kube,cluster]`."""

from __future__ import annotations

import argparse
import json
import sys
import time

from tests.infra.config import Component, cache_root
from tests.infra.env import Environment
from tests.infra.proc import InfraError, format_duration, log


def _components(value: str) -> set[Component]:
    try:
        return {Component(name.strip()) for name in value.split(",") if name.strip()}
    except ValueError as exc:
        choices = ",".join(c.value for c in Component)
        raise argparse.ArgumentTypeError(f"{exc}; choose from {choices}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.infra", description=__doc__)
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument(
        "--components",
        type=_components,
        default=set(Component),
        help="comma-separated subset of kafka,kube,cluster (default: all); cluster implies kube",
    )
    args = parser.parse_args(argv)
    environment = Environment()
    try:
        if args.action == "up":
            started = time.monotonic()
            environment.up(args.components)
            elapsed = format_duration(time.monotonic() - started)
            log(f"environment ready in {elapsed}; endpoints in {environment.env_file}")
            print(json.dumps(environment.read(), indent=2, sort_keys=True))
        elif args.action == "down":
            environment.down(args.components)
        else:
            print(f"state: {environment.state}\ncache: {cache_root()}")
            for component, line in environment.status().items():
                print(f"{component:8} {line}")
    except InfraError as exc:
        log(f"FAILED: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
