"""The data plane's calls served ahead of the aiohttp application.

``POST /generate``, ``/v1/chat/completions`` and ``/v1/completions`` are nearly every request a
proxy serves. Through the application each paid for the router's lookup, the match info, the
current-app context and a coroutine per middleware (client deadlines, error bodies,
authentication) on top of its own work. The server's handler (:func:`install`) sends them
straight to one function that takes the same steps in the same order: the client's deadlines
(``client_limits.py``), the data plane's authentication and per-job count (``auth.py``), the
forwarder, and ``ErrorBody`` answers for aiohttp's own errors (a body over ``max_body_bytes``:
413) and for anything unhandled (``errors.py``). Every other request, and a data-plane request
that carries ``Expect`` (its ``100 Continue`` is the application's), goes through the
application unchanged.
"""

from __future__ import annotations

from aiohttp import hdrs, web
from aiohttp.web_request import BaseRequest

from services.llm_proxy.app import AUTH, CLIENTS, FORWARDER
from services.llm_proxy.auth import ProxyAuth
from services.llm_proxy.calls import Forwarder
from services.llm_proxy.client_limits import ClientGuard
from services.llm_proxy.errors import answer_error
from services.llm_proxy.responses import CallRequest, error_response
from services.protocol import PlatformError

ROUTES = frozenset({"/generate", "/v1/chat/completions", "/v1/completions"})


class DataPlane:
    """The server's request handler: data-plane calls here, everything else to ``app``."""

    def __init__(self, app: web.Application, forwarder: Forwarder, auth: ProxyAuth, clients: ClientGuard) -> None:
        self.app_handle = app._handle
        self.forwarder = forwarder
        self.auth = auth
        self.clients = clients

    async def __call__(self, request: BaseRequest) -> web.StreamResponse:
        assert isinstance(request, web.Request)  # made by the application's request factory
        if request.method != hdrs.METH_POST or request.path not in ROUTES or hdrs.EXPECT in request.headers:
            return await self.app_handle(request)
        connection = self.clients.headers_in(request)
        try:
            return await self.serve(request)
        finally:
            self.clients.answered(connection)

    async def serve(self, request: CallRequest) -> web.StreamResponse:
        """One data-plane call whose headers and body are in (here or from ``lean_server.py``)."""
        try:
            try:
                await self.auth.data_plane(request)
            except PlatformError as exc:
                return error_response(exc)
            return await self.forwarder.handle(request)
        except Exception as exc:  # what the ``error_bodies`` middleware answers on the application's routes
            return answer_error(request, exc)


def install(server: web.Server, app: web.Application) -> DataPlane:
    """Serve ``server``'s requests (``AppRunner.server``, once set up: the application has started)
    through :class:`DataPlane`."""
    plane = DataPlane(app, app[FORWARDER], app[AUTH], app[CLIENTS])
    server.request_handler = plane
    return plane
