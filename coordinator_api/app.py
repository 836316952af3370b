"""The FastAPI application: ``uvicorn coordinator_api.app:app`` or ``pulsar-txn api``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from .api import reads, router, writes
from .core import Core
from .settings import Settings, get_settings

STATIC = Path(__file__).resolve().parent / "static"
log = logging.getLogger("coordinator_api")


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

    app.include_router(router)
    app.include_router(reads)
    app.include_router(writes)

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


app = create_app()
