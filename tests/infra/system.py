"""Programs the tests run that come from the operating system's packages, not from the artifact cache.

Today one: Debian's `chromium`, the headless browser `tests/ui/test_ui_browser.py` takes screenshots of the web view
with. Every `up` ensures it, whatever the components (like `build.SHARED`): when `chromium` is not on PATH it runs
`apt-get install -y --no-install-recommends chromium` (after `apt-get update` when the package lists do not know
it), as root, waiting for the dpkg lock if another install holds it. The `chromium` fixture never installs
anything: a missing browser fails the test, naming the `up` command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.infra.proc import InfraError, format_duration, log, tail

#: How long apt-get waits for a dpkg lock another installer holds, in seconds.
_LOCK_TIMEOUT_SECONDS = 600


@dataclass(frozen=True)
class SystemPackage:
    """A Debian package that provides one program the tests run."""

    package: str
    program: str
    description: str

    def which(self) -> Path | None:
        found = shutil.which(self.program)
        return Path(found) if found else None

    def ensure(self, *, log_dir: Path) -> Path:
        """The program's path, installing its package with apt-get first if it is not on PATH."""
        found = self.which()
        if found is not None:
            return found
        if shutil.which("apt-get") is None:
            raise InfraError(f"`{self.program}` is missing and there is no apt-get: install {self.description}")
        if os.geteuid() != 0:
            raise InfraError(
                f"`{self.program}` is missing: install the Debian package as root "
                f"(`apt-get install -y --no-install-recommends {self.package}`) or run `up` as root"
            )
        log_dir.mkdir(parents=True, exist_ok=True)
        install_log = log_dir / f"apt-{self.package}.log"
        log(f"installing {self.description} (Debian package {self.package}, about 1-2 min); log: {install_log}")
        started = time.monotonic()
        if not _apt_knows(self.package):
            _apt(["update"], install_log=install_log)
        _apt(["install", "-y", "--no-install-recommends", self.package], install_log=install_log)
        found = self.which()
        if found is None:
            raise InfraError(
                f"`apt-get install {self.package}` did not put `{self.program}` on PATH; see {install_log}"
            )
        log(f"installed {self.package} in {format_duration(time.monotonic() - started)}: {found}")
        return found


def _apt_knows(package: str) -> bool:
    """Whether the package lists name a candidate version of `package` (they may be empty on a fresh image)."""
    result = subprocess.run(
        ["apt-cache", "policy", package], capture_output=True, text=True, check=False
    )
    return result.returncode == 0 and "Candidate:" in result.stdout and "Candidate: (none)" not in result.stdout


def _apt(arguments: list[str], *, install_log: Path) -> None:
    command = ["apt-get", "-q", "-o", f"DPkg::Lock::Timeout={_LOCK_TIMEOUT_SECONDS}", *arguments]
    with install_log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        result = subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            check=False,
        )
    if result.returncode != 0:
        raise InfraError(f"`{' '.join(command)}` failed (rc={result.returncode}):\n{tail(install_log, 40)}")


CHROMIUM = SystemPackage("chromium", "chromium", "Chromium, the headless browser of the web view's tests")

#: What every `up` ensures, whatever the components.
PACKAGES: tuple[SystemPackage, ...] = (CHROMIUM,)


def ensure_all(*, log_dir: Path) -> None:
    for package in PACKAGES:
        package.ensure(log_dir=log_dir)
