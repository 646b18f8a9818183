"""The HTTP API and page over a ``modular.serving.Scheduler``: FastAPI routes, the token and limits, server-sent
events, and one plain HTML page shipped in the package. May import `modular.serving` and below.

``make_app(scheduler, settings)`` is the FastAPI app; ``start_server`` runs it under uvicorn (``modular serve``,
tests on a free loopback port). FastAPI and uvicorn are the optional extra ``serve``. See docs/serving.md.
"""

from typing import TYPE_CHECKING

from offload.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from modular.http.app import make_app
    from modular.http.server import RunningServer, start_server
    from modular.http.settings import ServerSettings

__getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = ["RunningServer", "ServerSettings", "make_app", "start_server"]
