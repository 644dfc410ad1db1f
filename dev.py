#!/usr/bin/env python3
"""Bootstrap for newcomers and CI, standard library only.

    python3 dev.py up      # the dashboard on the embedded PostgreSQL (http://localhost:8000)
    python3 dev.py test    # the whole test suite (extra arguments go to pytest); it ends
                           # with its wall time, within ten minutes on two quiet cores

Makes .venv and installs the project into it (again only when pyproject.toml changed).
The browser tests need Debian's chromium: `test` installs it with apt-get when it is
missing and we are root; otherwise it says what to install.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")


def ensure_venv(extras: str) -> None:
    stamp = VENV / f".installed-{extras}"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == want:
        return
    if not (BIN / "python").exists():
        print("creating .venv …", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    print(f"installing switchboard[{extras}] into .venv …", flush=True)
    subprocess.run(
        [
            str(BIN / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-e",
            f".[{extras}]" if extras != "base" else ".",
        ],
        check=True,
        cwd=ROOT,
    )
    stamp.write_text(want)


def ensure_chromium() -> None:
    if Path(CHROMIUM).exists():
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("installing Debian's chromium for the browser tests …", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env)
        return
    sys.exit(
        f"the browser tests need Chromium at {CHROMIUM}: install Debian's package "
        "(sudo apt-get install chromium) or set CHROMIUM_PATH"
    )


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command == "up":
        ensure_venv("base")
        os.execv(BIN / "switchboard", [str(BIN / "switchboard"), "up", *rest])
    if command == "test":
        ensure_venv("test")
        ensure_chromium()
        os.chdir(ROOT)
        os.execv(BIN / "python", [str(BIN / "python"), "-m", "pytest", *rest])
    print(__doc__)
    return 0 if command in ("help", "-h", "--help") else 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
