"""The FastAPI app of ``modular serve``: the routes over a ``JobService`` (docs/serving.md lists them): one
``Scheduler`` of this process (``LocalJobs``), or the replicas of a Ray Serve deployment.

Every route but ``/healthz`` needs the token when the server has one (``modular/http/settings.py``);
errors are JSON, ``{"error": {"type": ..., "message": ...}}``, with the message ``modular batch`` and ``modular
run`` give for the same problem, and never a traceback. A request names only the workflows the server was
started with; results are read back by job id and index, from names the server made.
"""

from __future__ import annotations

import hmac
import importlib.resources
import logging
import threading
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from modular.batch.jobs import MAX_SEED
from modular.errors import InputTypeError, MissingInputError, UnknownInputError
from modular.http.events_stream import event_stream
from modular.http.service import JobService, LocalJobs
from modular.http.settings import ServerSettings
from modular.http.uploads import UploadError, read_job_body
from modular.serving.jobs import JobStateError, QueueFullError, UnknownJobError
from modular.serving.requests import PRIORITY_BOUND, REQUEST_KEYS, RequestError
from modular.serving.scheduler import Scheduler
from modular.serving.store import STATES

__all__ = ["make_app"]

log = logging.getLogger(__name__)
# The page's script and style hold no secret; a browser loads them without the page's token (no header).
PAGE_ASSETS = {
    "/page.js": ("page.js", "text/javascript"),
    "/chart.js": ("chart.js", "text/javascript"),
    "/page.css": ("page.css", "text/css"),
}
OPEN_PATHS = frozenset({"/healthz", *PAGE_ASSETS})
# The page loads only from this server (previews arrive as data: URLs); a prompt cannot pull in a script.
PAGE_POLICY = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)
INTERNAL = "the server met an error; its log has the details"
BAD_REQUEST = (RequestError, MissingInputError, UnknownInputError, InputTypeError, UploadError)


def error_response(
    status: int, error: BaseException | str, kind: str | None = None, **headers: str
) -> JSONResponse:
    message = error if isinstance(error, str) else str(error)
    body = {"error": {"type": kind or type(error).__name__, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers or None)


def _request_schema(jobs: JobService) -> dict[str, Any]:
    """The JSON body of ``POST /v1/jobs`` as the OpenAPI schema shows it (the server checks it itself, with
    the batch format's messages): the served workflows and this server's limits are in it, so that a client
    made from the schema sends requests this server takes."""
    text = {"type": "string"}
    number = {"type": "number"}
    whole = {"type": "integer"}
    properties: dict[str, Any] = {
        "workflow": {
            **text,
            "enum": sorted(jobs.served),
            "description": "a served workflow's name (GET /v1/workflows)",
        },
        "prompt": text,
        "negative_prompt": text,
        "size": {**text, "pattern": "^[0-9]+x[0-9]+$", "description": "WIDTHxHEIGHT in pixels"},
        "steps": {**whole, "minimum": 1, "maximum": jobs.limits.max_steps},
        "guidance_scale": number,
        "seed": {**whole, "minimum": 0, "maximum": MAX_SEED, "description": "image i is made with seed + i"},
        "seeds": {"type": "array", "items": {**whole, "minimum": 0, "maximum": MAX_SEED}},
        "images_per_prompt": {**whole, "minimum": 1, "maximum": jobs.limits.max_images},
        "priority": {
            **whole,
            "minimum": -PRIORITY_BOUND,
            "maximum": PRIORITY_BOUND - 1,
            "description": "higher runs first (within fairness)",
        },
        "timeout": {**number, "exclusiveMinimum": 0, "maximum": threading.TIMEOUT_MAX},
        "inputs": {"type": "object", "description": "more call inputs, e.g. {'strength': 0.6}"},
        "images": {
            "type": "object",
            "additionalProperties": text,
            "description": "image inputs as base64 (PNG, JPEG, WebP), e.g. {'image': '...'}",
        },
    }
    assert set(properties) == set(REQUEST_KEYS)
    required = ["prompt"] if len(jobs.served) == 1 else ["workflow", "prompt"]  # one served: its own
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def make_app(jobs: Scheduler | JobService, settings: ServerSettings | None = None) -> FastAPI:
    """The app serving ``jobs``: a ``Scheduler`` (which the caller starts and closes) or any ``JobService``."""
    service = LocalJobs(jobs) if isinstance(jobs, Scheduler) else jobs
    settings = settings or ServerSettings()
    token = settings.resolved_token()
    app = FastAPI(
        title="modular serve",
        description="A queue of diffusion jobs over one components manager; see docs/serving.md.",
        version="1",
    )
    app.state.jobs = service
    app.state.settings = settings
    app.state.closing = closing = threading.Event()  # set on stop: the event streams end (server.py)

    @app.middleware("http")
    async def check_token(request: Request, call_next: Any) -> Response:
        if token is not None and request.url.path not in OPEN_PATHS:
            given = request.headers.get("authorization", "")
            given = (
                given[7:] if given.lower().startswith("bearer ") else request.query_params.get("token", "")
            )
            if not hmac.compare_digest(
                given.encode(), token.encode()
            ):  # constant time: no guessing by timing
                return error_response(
                    401,
                    "this server needs its token: send 'Authorization: Bearer <token>'",
                    "Unauthorized",
                    **{"WWW-Authenticate": "Bearer"},
                )
        try:
            return await call_next(request)
        except Exception:  # answered here: past this middleware Starlette re-raises, and uvicorn then drops
            # the client's kept-alive connection, so its next request would fail
            log.exception("%s %s failed", request.method, request.url.path)
            return error_response(500, INTERNAL, "InternalError")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(map(str, item['loc']))}: {item['msg']}" for item in error.errors())
        return error_response(400, problems, "RequestError")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return error_response(error.status_code, str(error.detail), "HTTPError")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, INTERNAL, "InternalError")

    @app.get("/healthz")
    def health() -> dict[str, Any]:
        return {"ok": True}

    @app.post(
        "/v1/jobs",
        status_code=202,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": _request_schema(service)},
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "properties": {"request": {"type": "string", "description": "the JSON request"}},
                            "additionalProperties": {"type": "string", "format": "binary"},
                        }
                    },
                },
            }
        },
    )
    async def submit(request: Request) -> Response:
        try:
            data, uploads = await read_job_body(request, service.uploads, settings)
            # off the event loop: the check and the store's synced write must not hold up other requests
            job = await run_in_threadpool(service.submit, data, uploads)
        except QueueFullError as error:
            return error_response(429, error, **{"Retry-After": str(error.retry_after)})
        except BAD_REQUEST as error:
            status = getattr(error, "status", 400)
            return error_response(status, error)
        answer = {key: job[key] for key in ("id", "state", "position", "seeds")}
        return JSONResponse(answer, status_code=202, headers={"Location": f"/v1/jobs/{job['id']}"})

    @app.get("/v1/jobs", response_model=list[dict[str, Any]])
    def list_jobs(state: str | None = None) -> Any:
        states = tuple(state.split(",")) if state else None
        unknown = [name for name in states or () if name not in STATES]
        if unknown:
            message = f"state {', '.join(map(repr, unknown))} is not one of {', '.join(STATES)}"
            return error_response(400, message, "RequestError")
        return service.jobs(states)

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str) -> Response:
        try:
            return JSONResponse(service.describe(job_id))
        except UnknownJobError as error:
            return error_response(404, error)

    @app.delete("/v1/jobs/{job_id}", status_code=202)
    def cancel_job(job_id: str) -> Response:
        try:
            job = service.cancel(job_id)
        except UnknownJobError as error:
            return error_response(404, error)
        except JobStateError as error:
            return error_response(409, error)
        return JSONResponse(job, status_code=202)

    @app.get(
        "/v1/jobs/{job_id}/result", response_class=Response, responses={200: {"content": {"image/png": {}}}}
    )
    def result(job_id: str, index: int = Query(0, ge=0)) -> Response:
        try:
            job = service.describe(job_id)
        except UnknownJobError as error:
            return error_response(404, error)
        if index >= len(job["results"]):
            if job["state"] == "done":
                return error_response(
                    404,
                    f"job {job_id!r} made {len(job['results'])} images; index {index} is not one",
                    "HTTPError",
                )
            return error_response(
                409, f"job {job_id!r} is {job['state']}; image {index} is not made", "JobStateError"
            )
        return FileResponse(service.results / job["results"][index], media_type="image/png")

    @app.get(
        "/v1/jobs/{job_id}/events",
        response_class=Response,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    def job_events(job_id: str, request: Request) -> Response:
        try:
            service.describe(job_id)
        except UnknownJobError as error:
            return error_response(404, error)
        return event_stream(service, request, job_id, closing)

    @app.get("/v1/events", response_class=Response, responses={200: {"content": {"text/event-stream": {}}}})
    def all_events(request: Request) -> Response:
        return event_stream(service, request, None, closing)

    @app.get("/v1/queue")
    def queue() -> dict[str, Any]:
        return service.queue()

    @app.post("/v1/queue/pause")
    def pause() -> dict[str, Any]:
        service.pause()
        return {"paused": True}

    @app.post("/v1/queue/resume")
    def resume() -> dict[str, Any]:
        service.resume()
        return {"paused": False}

    @app.get(
        "/v1/manager",
        response_model=None,
        responses={200: {"content": {"application/json": {}, "text/plain": {}}}},  # ?format=text: the table
    )
    def manager(format: str = Query("json", pattern="^(json|text)$")) -> Any:
        if format == "text":
            return PlainTextResponse(service.manager_text())
        return {"components": service.components()}

    @app.get("/v1/memory")
    def memory() -> dict[str, Any]:
        return service.memory()

    @app.get("/v1/workflows")
    def workflows() -> list[dict[str, Any]]:
        return [service.served.describe(name) for name in service.served]

    @app.get("/", response_class=HTMLResponse)
    def page() -> HTMLResponse:
        return HTMLResponse(_page_file("index.html"), headers={"Content-Security-Policy": PAGE_POLICY})

    for path, (name, media_type) in PAGE_ASSETS.items():
        app.add_api_route(path, _asset_route(name, media_type), methods=["GET"], include_in_schema=False)

    return app


def _page_file(name: str) -> str:
    return importlib.resources.files("modular.http").joinpath(f"page/{name}").read_text(encoding="utf-8")


def _asset_route(name: str, media_type: str) -> Any:
    def asset() -> Response:
        return Response(_page_file(name), media_type=media_type, headers={"Cache-Control": "no-cache"})

    return asset
