"""Servers: ordering, credentials, the provisioning job queue and the paid-period lifecycle.

* :mod:`vpsshop.servers.api` - the ``/servers`` endpoints;
* :mod:`vpsshop.servers.jobs` - hypervisor work as database-backed jobs (``servers-jobs`` task);
* :mod:`vpsshop.servers.lifecycle` - renewal, suspension, termination (``servers-lifecycle`` task);
* :mod:`vpsshop.servers.sshkeys` - the ``/ssh-keys`` store;
* :mod:`vpsshop.servers.reinstall` - ``POST /servers/{id}/reinstall``;
* :mod:`vpsshop.servers.console` - console tickets and the console WebSocket;
* :mod:`vpsshop.servers.credentials` - root passwords, encrypted at rest;
* :mod:`vpsshop.servers.models` - the tables.

Core runs the two background tasks in ``vpsshop serve`` and ``vpsshop worker`` (see
:func:`background_tasks`); ``docs/servers.md`` describes the behaviour for resellers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext
    from vpsshop.routing import ApiRoute
    from vpsshop.tasks import BackgroundTask


def routes() -> list[ApiRoute]:
    from vpsshop.servers import api, console, reinstall, sshkeys

    return [*api.routes(), *reinstall.routes(), *console.routes(), *sshkeys.routes()]


def background_tasks(ctx: AppContext) -> list[BackgroundTask]:
    """Provisioning jobs and lifecycle passes, offered through ``vpsshop.servers.hooks``."""
    from vpsshop.servers.jobs import run_jobs
    from vpsshop.servers.lifecycle import policy, run_lifecycle
    from vpsshop.tasks import BackgroundTask

    pol = policy(ctx)
    return [
        BackgroundTask("servers-jobs", pol.jobs_interval_seconds, lambda: run_jobs(ctx)),
        BackgroundTask("servers-lifecycle", pol.lifecycle_interval_seconds, lambda: run_lifecycle(ctx)),
    ]
