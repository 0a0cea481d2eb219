"""A real PostgreSQL server from the machine's own server binaries, data kept in the project.

Postgres refuses to run as root, so when the caller is root the server runs as the
``postgres`` account (Debian's packages create it) or, failing that, ``nobody``.
It listens on 127.0.0.1 only (no Unix socket: socket paths have a short length limit),
and trusts local connections: this is a developer's stack, not a deployment.

With a standby, two such servers stream to each other: the primary waits for the standby
to flush every commit (``synchronous_standby_names`` names it), and both keep
``wal_log_hints`` so that a crashed primary can be rewound (``pg_rewind``) and rejoin as
the new standby after a failover.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matcher_devstack.procs import DevstackError, pid_alive, tail, wait_until

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


def replication_config(
    *, name: str, sync_standby: str | None = None, primary_port: int | None = None
) -> str:
    """The lines that make a server one node of a primary/standby pair: ``name`` is its
    application_name towards its primary; a primary with ``sync_standby`` waits for that
    standby on every commit; ``primary_port`` is where a standby streams from."""
    lines = [
        f"cluster_name = '{name}'",
        "wal_level = replica",
        "wal_log_hints = on",
        "wal_keep_size = '256MB'",
        "hot_standby = on",
        "synchronous_commit = on",
        f"synchronous_standby_names = '{sync_standby or ''}'",
    ]
    if primary_port is not None:
        conninfo = f"host=127.0.0.1 port={primary_port} user={SUPERUSER} application_name={name}"
        lines.append(f"primary_conninfo = '{conninfo}'")
    return "\n".join(lines) + "\n"


def multi_host_url(ports: Sequence[int], database: str = DATABASE) -> str:
    """A libpq URL naming every node, the primary first; a client connects to whichever
    accepts writes (``target_session_attrs=read-write``), so it survives a failover."""
    hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
    return f"postgresql://{SUPERUSER}@{hosts}/{database}?target_session_attrs=read-write"


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


def _prepare_home(paths: PostgresPaths, user: str | None) -> None:
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


def write_config(paths: PostgresPaths, port: int, extra: str = "") -> None:
    """(Re)write the devstack's settings of this server; a running one needs ``reload``."""
    devstack_conf = paths.data / "devstack.conf"
    devstack_conf.write_text(_config(port, find_bindir()) + extra)
    user = _run_as()
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(devstack_conf, entry.pw_uid, entry.pw_gid)


def start(
    paths: PostgresPaths,
    port: int,
    *,
    timeout: float,
    extra_config: str = "",
    standby: bool = False,
) -> None:
    """Start the server unless it runs; return once it accepts a connection. A
    ``standby`` (its data a copy of a primary's) starts in recovery and creates nothing."""
    bindir = find_bindir()
    user = _run_as()
    _prepare_home(paths, user)
    if standby:
        if not (paths.data / "PG_VERSION").exists():
            raise DevstackError(f"no standby data at {paths.data}")
        (paths.data / "standby.signal").touch()
    elif not (paths.data / "PG_VERSION").exists():
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
    devstack_conf.write_text(_config(port, bindir) + extra_config)
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
    if not standby:
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


def _query(port: int, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Run one statement on the server on ``port``; its rows (none for a command)."""
    import psycopg

    try:
        with psycopg.connect(url(port, "postgres"), connect_timeout=3, autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description is not None else []
    except psycopg.Error as exc:
        raise DevstackError(f"Postgres on 127.0.0.1:{port}: {sql}: {exc}") from exc


def accepts_writes(port: int) -> bool:
    """True when the server on ``port`` is a primary that commits a write transaction
    (committed locally: this probe never waits for a synchronous standby)."""
    import psycopg

    try:
        with psycopg.connect(url(port, "postgres"), connect_timeout=3) as conn:
            in_recovery = conn.execute("SELECT pg_is_in_recovery()").fetchone()
            if in_recovery is None or in_recovery[0]:
                return False
            conn.execute("SET LOCAL synchronous_commit = local")
            conn.execute("SELECT txid_current()")
        return True
    except psycopg.Error:
        return False


def replication(port: int) -> list[tuple[str, str, str]]:
    """(application_name, state, sync_state) of each standby streaming from ``port``."""
    try:
        rows = _query(port, "SELECT application_name, state, sync_state FROM pg_stat_replication")
    except DevstackError:
        return []
    return [(str(a), str(b), str(c)) for a, b, c in rows]


def wait_streaming(primary_port: int, name: str, *, sync: bool, timeout: float) -> None:
    """Wait until standby ``name`` streams from the primary (and, with ``sync``, is its
    synchronous standby)."""

    def streaming() -> bool:
        return any(
            app == name and state == "streaming" and (not sync or sync_state == "sync")
            for app, state, sync_state in replication(primary_port)
        )

    if not wait_until(streaming, timeout=timeout, interval=0.1):
        want = "its synchronous standby" if sync else "streaming from it"
        raise DevstackError(
            f"standby '{name}' was not {want} (primary 127.0.0.1:{primary_port}) within "
            f"{timeout:.0f}s; pg_stat_replication: {replication(primary_port) or 'empty'}"
        )


def reload(port: int, setting: str, value: str, *, timeout: float = 30.0) -> None:
    """Have the server on ``port`` reread its configuration; return once ``setting`` has
    ``value`` (a reload is a signal: it takes effect a moment later)."""
    _query(port, "SELECT pg_reload_conf()")

    def applied() -> bool:
        try:
            return _query(port, "SELECT current_setting(%s)", (setting,)) == [(value,)]
        except DevstackError:
            return False

    if not wait_until(applied, timeout=timeout, interval=0.05):
        raise DevstackError(f"{setting} did not become '{value}' on 127.0.0.1:{port}")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[-1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def kill(paths: PostgresPaths, *, timeout: float = 30.0) -> int | None:
    """Crash the server: SIGKILL the postmaster and each of its processes at once (as a
    machine that lost power would), and return the postmaster's pid once all are gone;
    None if it did not run."""
    pid = running_pid(paths)
    if pid is None:
        return None
    doomed = [pid, *_children(pid)]
    for each in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)
    if not wait_until(lambda: not any(pid_alive(p, "postgres") for p in doomed), timeout=timeout):
        raise DevstackError(f"PostgreSQL (pid {pid}) outlived SIGKILL for {timeout:.0f}s")
    # Dead, but perhaps not yet reaped: a zombie's pid still answers kill(pid, 0), and
    # Postgres would take the lock file for another postmaster's.
    (paths.data / "postmaster.pid").unlink(missing_ok=True)
    return pid


def promote(paths: PostgresPaths, port: int, *, timeout: float) -> None:
    """Promote the standby; return once it commits a write."""
    bindir = find_bindir()
    _run(
        [str(bindir / "pg_ctl"), "-D", str(paths.data), "-w", "-t", str(int(timeout)), "promote"],
        _run_as(),
        "pg_ctl promote",
    )
    if not wait_until(lambda: accepts_writes(port), timeout=timeout, interval=0.05):
        raise DevstackError(f"the promoted server on 127.0.0.1:{port} took no write")


def base_backup(paths: PostgresPaths, primary_port: int, *, timeout: float) -> None:
    """Copy the primary into ``paths`` (streaming the WAL it needs) as a standby's data."""
    bindir = find_bindir()
    user = _run_as()
    _prepare_home(paths, user)
    if paths.data.exists():
        shutil.rmtree(paths.data)
    _run(
        [
            "timeout",
            str(int(timeout)),
            str(bindir / "pg_basebackup"),
            "-h",
            "127.0.0.1",
            "-p",
            str(primary_port),
            "-U",
            SUPERUSER,
            "-D",
            str(paths.data),
            "-X",
            "stream",
            "--checkpoint=fast",
            "--no-password",
        ],
        user,
        "pg_basebackup",
    )


def rewind(paths: PostgresPaths, primary_port: int, *, timeout: float) -> str:
    """Rewind a crashed former primary onto the current primary's timeline (pg_rewind
    first finishes its crash recovery in single-user mode); return pg_rewind's last line."""
    bindir = find_bindir()
    user = _run_as()
    _prepare_home(paths, user)
    source = f"host=127.0.0.1 port={primary_port} user={SUPERUSER} dbname=postgres"
    started = time.monotonic()
    # A just-promoted primary writes its new timeline to its control file only at its
    # next checkpoint, and pg_rewind reads the source's timeline there: without this it
    # would rewind onto the old timeline, and the standby could not start.
    _query(primary_port, "CHECKPOINT")
    result = subprocess.run(
        [
            "timeout",
            str(int(timeout)),
            str(bindir / "pg_rewind"),
            f"--target-pgdata={paths.data}",
            f"--source-server={source}",
        ],
        user=user,
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
        cwd="/",
    )
    if result.returncode != 0:
        output = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise DevstackError(f"pg_rewind failed after {time.monotonic() - started:.1f}s:\n{output}")
    lines = (result.stdout + result.stderr).strip().splitlines()
    # The source's files came along: this node's own settings are written before it starts.
    for leftover in ("postmaster.opts", "recovery.signal"):
        (paths.data / leftover).unlink(missing_ok=True)
    return lines[-1] if lines else "pg_rewind done"
