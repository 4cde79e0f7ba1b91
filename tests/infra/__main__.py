"""`python -m tests.infra up|down|status [--components kafka,kube,cluster] [--kueue-version 0.17.0|0.12.10]`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

#: Also in tests.infra.config, which cannot be imported before the version is set (its artifacts depend on it).
_KUEUE_VERSION_ENV = "TRACKER_TESTENV_KUEUE_VERSION"


def main(argv: list[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--kueue-version")
    known, _ = pre.parse_known_args(argv)
    if known.kueue_version:
        os.environ[_KUEUE_VERSION_ENV] = known.kueue_version
    try:
        from tests.infra import config
    except ValueError as exc:  # an unsupported version
        print(f"[testenv] FAILED: {exc}", file=sys.stderr)
        return 2
    from tests.infra.env import Environment
    from tests.infra.proc import InfraError, format_duration, log

    def components(value: str) -> set[config.Component]:
        try:
            return {config.Component(name.strip()) for name in value.split(",") if name.strip()}
        except ValueError as exc:
            choices = ",".join(c.value for c in config.Component)
            raise argparse.ArgumentTypeError(f"{exc}; choose from {choices}") from exc

    parser = argparse.ArgumentParser(prog="python -m tests.infra", description=__doc__)
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument(
        "--components",
        type=components,
        default=set(config.Component),
        help="comma-separated subset of kafka,kube,cluster (default: all); cluster implies kube",
    )
    parser.add_argument(
        "--kueue-version",
        choices=config.KUEUE_VERSIONS,
        help=f"the Kueue the simulated cluster runs (default: ${config.KUEUE_VERSION_ENV}, else "
        f"{config.KUEUE_VERSIONS[0]}); run pytest with the same ${config.KUEUE_VERSION_ENV}",
    )
    args = parser.parse_args(argv)
    environment = Environment()
    try:
        if args.action == "up":
            started = time.monotonic()
            environment.up(args.components)
            elapsed = format_duration(time.monotonic() - started)
            log(f"environment ready in {elapsed} (Kueue {config.KUEUE_VERSION}); endpoints in {environment.env_file}")
            print(json.dumps(environment.read(), indent=2, sort_keys=True))
        elif args.action == "down":
            environment.down(args.components)
        else:
            data: dict[str, Any] = environment.read().get(config.Component.CLUSTER.value, {})
            print(f"state: {environment.state}\ncache: {config.cache_root()}\nkueue: {config.KUEUE_VERSION} "
                  f"(running: {data.get('kueue_version', '-')})")
            for component, line in environment.status().items():
                print(f"{component:8} {line}")
    except InfraError as exc:
        log(f"FAILED: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
