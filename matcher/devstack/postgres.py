"""A real PostgreSQL server from the machine's own server binaries, data kept in the project.

Postgres refuses to run as root, so when the caller is root the server runs as the
``postgres`` account (Debian's packages create it) or, failing that, ``nobody``.
It listens on 127.0.0.1 only (no Unix socket: socket paths have a short length limit),
and trusts local connections: this is a developer's stack, not a deployment.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from matcher.devstack.procs import DevstackError, pid_alive, tail, wait_until

SUPERUSER = "matcher"
DATABASE = "matcher"
_INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or under "
    "/usr/lib/postgresql/*/bin: install them (Debian/Ubuntu: apt-get install postgresql; "
    "Fedora: dnf install postgresql-server; macOS: brew install postgresql@15)"
)


@dataclass(frozen=True)
class PostgresPaths:
    home: Path

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def log(self) -> Path:
        return self.home / "postgres.log"


def find_bindir() -> Path:
    """The directory holding initdb, pg_ctl and postgres, newest major version first."""
    candidates: list[Path] = []
    on_path = shutil.which("pg_ctl")
    if on_path is not None:
        candidates.append(Path(on_path).resolve().parent)

    def major(path: Path) -> int:
        found = re.search(r"(\d+)", path.parent.name)
        return int(found.group(1)) if found else 0

    for pattern in ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin"):
        candidates.extend(sorted(Path("/").glob(pattern.lstrip("/")), key=major, reverse=True))
    for bindir in candidates:
        if all((bindir / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    raise DevstackError(_INSTALL_HINT)


def _run_as() -> str | None:
    """The account to run the server as: None means the caller's own (it is not root)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise DevstackError("running as root, and neither a 'postgres' nor a 'nobody' account exists")


def _run(cmd: list[str], user: str | None, what: str) -> None:
    result = subprocess.run(
        cmd, user=user, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )
    if result.returncode != 0:
        output = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise DevstackError(f"{what} failed:\n{output}")


def _chown_tree(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs)]:
            os.chown(name, entry.pw_uid, entry.pw_gid)
        for name in files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)


def _config(port: int, bindir: Path) -> str:
    lines = [
        "listen_addresses = '127.0.0.1'",
        f"port = {port}",
        "unix_socket_directories = ''",
        "max_connections = 300",
        "shared_buffers = '256MB'",
        "log_line_prefix = '%m [%p] %q%u@%d '",
    ]
    # pg_stat_statements ships with Debian's server package; the benchmark profiles with it.
    if (bindir.parent / "lib" / "pg_stat_statements.so").exists():
        lines.append("shared_preload_libraries = 'pg_stat_statements'")
    return "\n".join(lines) + "\n"


def running_pid(paths: PostgresPaths) -> int | None:
    try:
        pid = int((paths.data / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid_alive(pid, "postgres") else None


def url(port: int, database: str = DATABASE) -> str:
    return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{database}"


def _accepts_connection(port: int) -> bool:
    import psycopg

    try:
        with psycopg.connect(url(port, "postgres"), connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def start(paths: PostgresPaths, port: int, *, timeout: float) -> None:
    """Start the server unless it runs; return once it accepts a connection."""
    bindir = find_bindir()
    user = _run_as()
    paths.home.mkdir(parents=True, exist_ok=True)
    if user is not None:
        _chown_tree(paths.home, user)
        probe = subprocess.run(["test", "-w", str(paths.home)], user=user, check=False)
        if probe.returncode != 0:
            raise DevstackError(
                f"PostgreSQL runs as '{user}' (it refuses root), and '{user}' cannot write "
                f"{paths.home}: make its parent directories searchable (chmod o+x) or set "
                "MATCHER_DEVSTACK_DIR to such a place"
            )
    if not (paths.data / "PG_VERSION").exists():
        _run(
            [
                str(bindir / "initdb"),
                "-D",
                str(paths.data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
            ],
            user,
            "initdb",
        )
        with (paths.data / "postgresql.conf").open("a") as conf:
            conf.write("\ninclude_if_exists = 'devstack.conf'\n")
    devstack_conf = paths.data / "devstack.conf"
    devstack_conf.write_text(_config(port, bindir))
    if user is not None:
        _chown_tree(paths.home, user)

    if running_pid(paths) is None:
        (paths.data / "postmaster.pid").unlink(missing_ok=True)  # stale after a hard stop
        result = subprocess.run(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(paths.data),
                "-l",
                str(paths.log),
                "-w",
                "-t",
                str(int(timeout)),
                "start",
            ],
            user=user,
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        if result.returncode != 0:
            raise DevstackError(
                f"PostgreSQL did not start; the end of {paths.log}:\n{tail(paths.log)}"
            )
    if not wait_until(lambda: _accepts_connection(port), timeout=timeout):
        raise DevstackError(
            f"PostgreSQL did not accept a connection on 127.0.0.1:{port} within "
            f"{timeout:.0f}s; the end of {paths.log}:\n{tail(paths.log)}"
        )
    _ensure_database(port)


def _ensure_database(port: int) -> None:
    import psycopg

    with psycopg.connect(url(port, "postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
        if exists.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{DATABASE}"')


def stop(paths: PostgresPaths, *, timeout: float = 60.0) -> None:
    if running_pid(paths) is None:
        return
    bindir = find_bindir()
    pg_ctl = str(bindir / "pg_ctl")
    _run(
        [pg_ctl, "-D", str(paths.data), "-m", "fast", "-w", "-t", str(int(timeout)), "stop"],
        _run_as(),
        "pg_ctl stop",
    )
