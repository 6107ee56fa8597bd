"""A throw-away PostgreSQL for the demo and the tests.

It uses the `pgserver` package where installed (it ships PostgreSQL binaries in its wheel), else local
PostgreSQL binaries (`initdb`, `pg_ctl` on PATH or under /usr/lib/postgresql/*/bin), and otherwise says what
to install. The server listens on a Unix socket in its data directory only.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

from dpsql.errors import ConfigError


class EmbeddedPostgres:
    """Start with `start()` (returns a postgresql:// URL); stop with `stop()` unless `keep` was asked."""

    def __init__(self, data_dir: str | Path | None = None, keep: bool = False):
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="dpsql-pg-"))
        self.keep = keep
        self._server = None
        self._pg_ctl: str | None = None
        self.url: str | None = None

    def start(self) -> str:
        pgserver = _pgserver()
        if pgserver is not None:
            self._server = pgserver.get_server(self.data_dir, cleanup_mode=None if self.keep else "stop")
            self.url = self._server.get_uri()
        else:
            self.url = self._start_local()
        return self.url

    def _start_local(self) -> str:
        bin_dir = _local_bin_dir()
        if bin_dir is None:
            raise ConfigError("no PostgreSQL to start: neither the pgserver package nor initdb/pg_ctl were found",
                              "pip install pgserver (Python < 3.13), or install PostgreSQL server binaries "
                              "(e.g. apt-get install postgresql)")
        if os.geteuid() == 0:
            raise ConfigError("PostgreSQL refuses to run as root and pgserver is not installed",
                              "pip install pgserver, or run as an ordinary user")
        pgdata = self.data_dir / "pgdata"
        if not (pgdata / "PG_VERSION").exists():
            subprocess.run([str(bin_dir / "initdb"), "-D", str(pgdata), "-U", "postgres", "-A", "trust",
                            "--no-sync"], check=True, capture_output=True)
        self._pg_ctl = str(bin_dir / "pg_ctl")
        options = f"-k {self.data_dir} -c listen_addresses='' -c fsync=off"
        subprocess.run([self._pg_ctl, "-D", str(pgdata), "-o", options, "-w", "-l",
                        str(self.data_dir / "postgres.log"), "start"], check=True, capture_output=True)
        return f"postgresql://postgres@/postgres?host={self.data_dir}"

    def stop(self) -> None:
        if self.keep:
            return
        self.halt()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def halt(self) -> None:
        """Stop PostgreSQL (a fast shutdown: sessions are terminated) and keep its data; `start()` brings it back
        on the same socket, as an operator's restart would."""
        if self._server is not None:
            self._server.cleanup()
        elif self._pg_ctl is not None:
            subprocess.run([self._pg_ctl, "-D", str(self.data_dir / "pgdata"), "-m", "fast", "stop"],
                           check=False, capture_output=True)

    @staticmethod
    def stop_kept(data_dir: str | Path) -> None:
        """Stop an embedded PostgreSQL left running (`dpsql demo --keep`), keeping its files. pgserver runs it as
        its own user when started by root, so pgserver (not our pg_ctl) has to stop it."""
        data_dir = Path(data_dir)
        if (data_dir / "pgdata" / "PG_VERSION").exists():
            bin_dir = _local_bin_dir()
            if bin_dir is None:
                raise ConfigError("pg_ctl was not found", "install PostgreSQL server binaries")
            subprocess.run([str(bin_dir / "pg_ctl"), "-D", str(data_dir / "pgdata"), "-m", "fast", "stop"],
                           check=False, capture_output=True)
            return
        pgserver = _pgserver()
        if not (data_dir / "PG_VERSION").exists() or pgserver is None:
            raise ConfigError(f"{data_dir} holds no embedded PostgreSQL",
                              "give the directory that `dpsql demo --keep` printed")
        server = pgserver.get_server(data_dir, cleanup_mode="stop")  # attaches to the running one, or starts it
        server.cleanup()  # the last handle: stops it

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _pgserver():
    """The pgserver module, or None. Its import warns when XDG_RUNTIME_DIR is unset (as under sudo or in a
    container), which is no concern of a dpsql user: it then keeps its lock file in /tmp."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
        try:
            import pgserver
        except ImportError:
            return None
    return pgserver


def _local_bin_dir() -> Path | None:
    initdb = shutil.which("initdb")
    if initdb:
        return Path(os.path.realpath(initdb)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(candidates[-1]).parent if candidates else None
