"""``vpsshop backup`` and ``vpsshop restore``: a consistent copy of the shop's database, and back.

* **PostgreSQL**: ``pg_dump --format=custom`` (a consistent snapshot while the shop runs) and
  ``pg_restore`` (Debian package ``postgresql-client``; use the client of the server's major
  version or newer). The password travels in ``PGPASSWORD``, not on a command line.
* **SQLite**: the SQLite backup API (``sqlite3.Connection.backup``), which copies a consistent
  snapshot while other connections write.

A backup holds balances, the ledger, servers, top-ups, API key digests and every secret that is
stored encrypted (root passwords, TOTP secrets, webhook secrets) **but not the keys**: without
``secret_key`` and ``encryption_key`` (and any ``old_encryption_keys`` the rows still use) a
restored shop can neither authenticate its API keys nor reveal a root password. Keep the settings
file backed up separately, and never beside the database dumps.

Restore refuses a target database that already holds a shop unless ``--yes`` is given (then its
tables are replaced), and migrates the restored schema to this version of vpsshop, so a backup
made by an older version restores into a newer one.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from vpsshop.errors import ConfigError

PG_MAGIC = b"PGDMP"
SQLITE_MAGIC = b"SQLite format 3\x00"


class BackupError(Exception):
    """Backup or restore could not be done; the message says why and what to do."""


def _pg_target(database_url: str) -> tuple[str, dict[str, str]]:
    """A libpq URI without the password, and the environment that carries the password."""
    url = make_url(database_url)
    env = dict(os.environ)
    if url.password:
        env["PGPASSWORD"] = str(url.password)
    plain = url.set(drivername="postgresql", password=None)
    return plain.render_as_string(hide_password=False), env


def _sqlite_path(database_url: str) -> Path:
    url = make_url(database_url)
    if not url.database or url.database == ":memory:":
        raise BackupError("an in-memory SQLite database cannot be backed up")
    return Path(url.database)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BackupError(f"{name} is not installed (Debian: apt-get install postgresql-client)")
    return path


def backup(database_url: str, output: Path) -> str:
    """Write a backup of ``database_url`` to ``output``; returns what was done, for the operator."""
    dialect = make_url(database_url).get_backend_name()
    output.parent.mkdir(parents=True, exist_ok=True)
    if dialect == "postgresql":
        uri, env = _pg_target(database_url)
        done = subprocess.run(
            [
                _tool("pg_dump"),
                "--format=custom",
                "--no-owner",
                "--no-privileges",
                f"--file={output}",
                f"--dbname={uri}",
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise BackupError(f"pg_dump failed: {done.stderr.strip()}")
    elif dialect == "sqlite":
        source = _sqlite_path(database_url)
        if not source.is_file():
            raise BackupError(f"there is no database at {source}")
        tmp = output.with_name(output.name + ".partial")
        tmp.unlink(missing_ok=True)
        src, dst = sqlite3.connect(source), sqlite3.connect(tmp)
        try:
            src.backup(dst)
        finally:
            dst.close()
            src.close()
        tmp.replace(output)
    else:
        raise ConfigError(f"backups support PostgreSQL and SQLite, not {dialect}")
    os.chmod(output, 0o600)
    return f"backup of the {dialect} database written to {output} ({output.stat().st_size} bytes)"


def _holds_a_shop(engine: sa.Engine) -> bool:
    return "accounts" in sa.inspect(engine).get_table_names()


def restore(database_url: str, source: Path, *, replace: bool = False) -> str:
    """Restore the backup ``source`` into ``database_url`` and migrate it; returns what was done.

    :param replace: replace a database that already holds a shop (``--yes``).
    """
    if not source.is_file():
        raise BackupError(f"there is no backup at {source}")
    with source.open("rb") as f:
        head = f.read(16)
    dialect = make_url(database_url).get_backend_name()
    kind = "postgresql" if head.startswith(PG_MAGIC) else "sqlite" if head == SQLITE_MAGIC else None
    if kind is None:
        raise BackupError(f"{source} is not a vpsshop backup (neither a pg_dump custom archive nor SQLite)")
    if kind != dialect:
        raise BackupError(
            f"{source} is a {kind} backup; the configured database is {dialect}. "
            "Restore into the same kind of database."
        )
    from vpsshop.db import Database

    if dialect == "sqlite":
        _sqlite_path(database_url).parent.mkdir(parents=True, exist_ok=True)
    db = Database(database_url)
    try:
        if _holds_a_shop(db.engine) and not replace:
            raise BackupError(
                "the configured database already holds a shop: restore into an empty database, "
                "or pass --yes to replace its tables"
            )
        if dialect == "postgresql":
            uri, env = _pg_target(database_url)
            args = [_tool("pg_restore"), "--no-owner", "--no-privileges", "--exit-on-error", f"--dbname={uri}"]
            if replace:
                args[1:1] = ["--clean", "--if-exists"]
            done = subprocess.run([*args, str(source)], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise BackupError(f"pg_restore failed: {done.stderr.strip()}")
        else:
            db.dispose()
            target = _sqlite_path(database_url)
            target.parent.mkdir(parents=True, exist_ok=True)
            src, dst = sqlite3.connect(source), sqlite3.connect(target)
            try:
                src.backup(dst)
            finally:
                dst.close()
                src.close()
            db = Database(database_url)
        db.migrate()
    finally:
        db.dispose()
    return f"restored {source} into the {dialect} database and migrated it to this version"
