"""Servers: ordering, the customer's operations on a server, the provisioning job queue and the
paid-period lifecycle.

* :mod:`vpsshop.servers.orders` - quotes and orders (from the balance or by x402);
* :mod:`vpsshop.servers.resource` - the Server resource, listing and reading the account's servers;
* :mod:`vpsshop.servers.renewals` - renewals by hand and their quotes;
* :mod:`vpsshop.servers.control` - power actions, automatic renewal, reverse DNS;
* :mod:`vpsshop.servers.reinstall` - a fresh disk from a catalog OS;
* :mod:`vpsshop.servers.console` - serial console tickets;
* :mod:`vpsshop.servers.termination` - ending a server now (the customer's and the shop's), and what it credits;
* :mod:`vpsshop.servers.credentials` - root passwords, encrypted at rest, and revealing them;
* :mod:`vpsshop.servers.sshkeys` - the SSH key store;
* :mod:`vpsshop.servers.jobs` - hypervisor work as database-backed jobs (``servers-jobs`` task);
* :mod:`vpsshop.servers.lifecycle` - renewal, suspension, termination (``servers-lifecycle`` task);
* :mod:`vpsshop.servers.traffic` - traffic per period against the plan's allowance (``servers-traffic`` task);
* :mod:`vpsshop.servers.models` - the tables.

Core runs the three background tasks in ``vpsshop serve`` and ``vpsshop worker`` (see
:func:`background_tasks`); ``docs/servers.md`` describes the behaviour for resellers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.context import AppContext
    from vpsshop.tasks import BackgroundTask


async def _lifecycle(ctx: AppContext) -> object:
    """One ``servers-lifecycle`` pass, then the x402 authorizations still held for servers already
    ready (:func:`vpsshop.servers.held.settle_ready_holds`)."""
    from vpsshop.servers.held import settle_ready_holds
    from vpsshop.servers.lifecycle import run_lifecycle

    done = await run_lifecycle(ctx)
    await settle_ready_holds(ctx)
    return done


def background_tasks(ctx: AppContext) -> list[BackgroundTask]:
    """Provisioning jobs and lifecycle passes, offered through ``vpsshop.servers.hooks``."""
    from vpsshop.servers.jobs import run_jobs
    from vpsshop.servers.lifecycle import JOBS_QUEUED, PERIOD_STARTED, policy
    from vpsshop.servers.traffic import run_traffic
    from vpsshop.tasks import BackgroundTask

    pol = policy(ctx)
    return [
        BackgroundTask("servers-jobs", pol.jobs_interval_seconds, lambda: run_jobs(ctx), JOBS_QUEUED),
        BackgroundTask("servers-lifecycle", pol.lifecycle_interval_seconds, lambda: _lifecycle(ctx)),
        BackgroundTask(
            "servers-traffic", ctx.settings.traffic.sample_seconds, lambda: run_traffic(ctx), PERIOD_STARTED
        ),
    ]
