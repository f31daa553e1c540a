"""A PostgreSQL cluster of a test's own: initdb in a temporary directory, a free port.

A test that stops its database must never stop the machine's server, so it makes a cluster
with the machine's PostgreSQL binaries and stops only that one (`pg_ctl stop -D <its dir>`).
initdb and the server refuse to run as root, so as root they run as the `postgres` user,
which then owns the directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.processes import free_port, port_open, wait_until

PG_ROOT = Path("/usr/lib/postgresql")


def pg_bin() -> Path:
    """The bin folder of the newest PostgreSQL installed here."""
    versions = sorted(PG_ROOT.glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if not versions:
        raise FileNotFoundError(f"no PostgreSQL under {PG_ROOT}")
    return versions[-1].parent


def as_owner(argv: list[str]) -> list[str]:
    """Run as the postgres user when this process is root (PostgreSQL refuses root)."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@dataclass
class PostgresCluster:
    """A private cluster, trust authentication for `postgres` from `clients` (127.0.0.1 only by
    default); it listens on `host`."""

    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"
    clients: str | None = None
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tandem-pg-")))

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    def url(self, database: str) -> str:
        return f"postgres://postgres@{self.host}:{self.port}/{database}"

    def run(self, *argv: str) -> None:
        subprocess.run(as_owner(list(argv)), check=True, capture_output=True, timeout=120)

    def init(self) -> PostgresCluster:
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
        initdb = str(pg_bin() / "initdb")
        self.run(initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        if self.clients is not None:
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.clients} trust\n")
        return self

    def start(self) -> PostgresCluster:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses={self.host}"
        pg_ctl = str(pg_bin() / "pg_ctl")
        log = str(self.log_path)
        self.run(pg_ctl, "-D", str(self.data), "-l", log, "-o", options, "-w", "start")
        wait_until(lambda: port_open(self.port, self.host), 30, f"PostgreSQL on port {self.port}")
        return self

    def stop(self) -> None:
        """Fast shutdown of this cluster only: clients are disconnected, as in a crash."""
        if (self.data / "postmaster.pid").exists():
            self.run(str(pg_bin() / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def create_database(self, name: str) -> None:
        psql = str(pg_bin() / "psql")
        host = ["-h", self.host, "-p", str(self.port), "-U", "postgres", "-d", "postgres"]
        self.run(psql, *host, "-c", f'CREATE DATABASE "{name}"')

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
