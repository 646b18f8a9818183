"""The residency routers of this process, by application: how the ingress lists the worker replicas.

Ray Serve runs a handle's router in the process that calls through the handle (the ingress) and offers no
public way to list a deployment's replicas; the router sees them. Ray pickles a router's module by value,
so its globals would be copies: the table lives here, in a module imported by name.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["deployment_replicas", "remember_router"]

_ROUTERS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def remember_router(app_name: str, router: Any) -> None:
    """Keep ``router`` (a ``ResidencyRouter``) as the one of ``app_name`` in this process."""
    _ROUTERS[app_name] = router


def deployment_replicas(app_name: str) -> list[str] | None:
    """The ids of the worker replicas this process's router of ``app_name`` sees now, or ``None`` before
    this process has sent that application's workers a call (Ray starts a handle's router on its first)."""
    router = _ROUTERS.get(app_name)
    if router is None:
        return None
    return sorted(str(replica.replica_id.unique_id) for replica in list(router.curr_replicas.values()))
