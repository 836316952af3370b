"""The FastAPI application: ``uvicorn coordinator_api.app:app`` or ``pulsar-txn api``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .api import reads, router, writes
from .auth import bearer, require_read
from .core import Core
from .settings import Settings, get_settings

STATIC = Path(__file__).resolve().parent / "static"
log = logging.getLogger("coordinator_api")


def secure_reads(schema: dict[str, Any], routes: Sequence[BaseRoute]) -> None:
    """Declare the bearer token on the operations of ``routes`` guarded by ``require_read``.

    Mutations declare it themselves (their ``HTTPBearer`` dependency); reads check the header
    only when ``read_requires_token`` is set, so the spec says so only then (see ``create_app``).
    Idempotent: it only sets entries."""
    name = bearer.scheme_name
    schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes.setdefault(name, bearer.model.model_dump(by_alias=True, exclude_none=True))
    for route in routes:
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        if not any(d.dependency is require_read for d in route.dependencies):
            continue
        for method in route.methods:
            schema["paths"][route.path_format][method.lower()]["security"] = [{name: []}]


class TrustedHosts:
    """Starlette's ``TrustedHostMiddleware`` with the settings' ``trusted_hosts`` (none: any Host),
    read at the first request, so importing the app reads no settings. Refusing other Host names
    stops DNS rebinding against an API bound to loopback."""

    def __init__(self, app: ASGIApp, settings_of: Callable[[], Settings]) -> None:
        self.app = app
        self.settings_of = settings_of
        self.inner: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.inner is None:
            hosts = self.settings_of().trusted_host_list
            self.inner = TrustedHostMiddleware(self.app, allowed_hosts=hosts) if hosts else self.app
        await self.inner(scope, receive, send)


#: The dashboard's policy: its own script, style and API only, no plugins, and never in a frame
#: (its Abort and Replay buttons must not be clickjacked).
DASHBOARD_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                 "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
#: Everything else (JSON, the OpenAPI pages) may not be framed either.
OTHER_CSP = "frame-ancestors 'none'"


class SecurityHeaders:
    """Adds Content-Security-Policy (the dashboard's strict one on ``/`` and ``/static/``),
    X-Frame-Options DENY, X-Content-Type-Options nosniff and Referrer-Policy no-referrer to every
    HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        csp = DASHBOARD_CSP if path == "/" or path.startswith("/static/") else OTHER_CSP
        extra = [(b"content-security-policy", csp.encode()), (b"x-frame-options", b"DENY"),
                 (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {k.lower() for k, _ in message.get("headers", [])}
                message = {**message, "headers": [*message.get("headers", []),
                                                  *((k, v) for k, v in extra if k not in names)]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app; settings default to the ``PULSAR_TXN_*`` environment, read at start-up."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        core = Core.open(settings or get_settings())
        app.state.core = core
        core.start()
        log.info("control plane up: broker %s, database %s", core.settings.service_url, core.engine.url)
        try:
            yield
        finally:
            await core.close()

    app = FastAPI(
        title="pulsar-txn control plane",
        version="1",
        summary="Transaction and batch state of exactly-once Pulsar jobs; replay of parked batches.",
        lifespan=lifespan,
    )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors():
            loc = [str(p) for p in e.get("loc", ()) if p != "body"]
            if loc[-1:] == ["txn_id"] and e.get("type") == "string_pattern_mismatch":
                parts.append(f"not a transaction id: {e.get('input')!r} (expected '(most,least)', e.g. '(0,5)')")
                continue
            parts.append(f"{'.'.join(loc)}: {e.get('msg')}")
        return JSONResponse({"detail": "; ".join(parts) or "invalid request"}, status_code=422)

    app.add_middleware(TrustedHosts, settings_of=lambda: settings or get_settings())
    app.add_middleware(SecurityHeaders)

    app.include_router(router)
    # Mutations first: ``POST /batches/{id:path}/replay`` must precede ``GET /batches/{id:path}``,
    # which also matches its paths, so that a 405 for e.g. OPTIONS on a replay path says ``Allow: POST``.
    app.include_router(writes)
    app.include_router(reads)

    plain_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """The spec; reads declare the bearer token exactly when the server requires it for them."""
        schema = plain_openapi()  # FastAPI's, cached in app.openapi_schema
        core = getattr(app.state, "core", None)
        if (core.settings if core is not None else settings or get_settings()).read_requires_token:
            secure_reads(schema, reads.routes)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


app = create_app()
