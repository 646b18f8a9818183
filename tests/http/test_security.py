"""The server's security over real HTTP: where it binds, the token on every route but health (checked in
constant time), requests that can name only the served workflows, the limits (body, upload bytes and
pixels, steps, images, queue), result and upload names the server makes, and errors that are JSON with the
command line's messages and never a traceback."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import PIL.Image
import PIL.ImageFile
import pytest

from modular.cli.main import main
from modular.http import ServerSettings, start_server
from modular.http.settings import TOKEN_VARIABLE
from modular.serving import Limits
from tests.http.helpers import FLUX, SD, TOKEN, wait_for_state

SERVED = f"{FLUX}, {SD}"  # how messages list the served workflows


def request(**more: Any) -> dict[str, Any]:
    return {"workflow": SD, "prompt": "a red fox", "steps": 2, "size": "32x32", "seed": 7, **more}


def png(image: PIL.Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def noise_png(size: int = 32) -> bytes:
    return png(PIL.Image.fromarray((np.random.default_rng(1).random((size, size, 3)) * 255).astype(np.uint8)))


def error_of(response: httpx.Response) -> dict[str, str]:
    """The error of a refused request: the body is JSON ``{"error": {"type", "message"}}`` and nothing else."""
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == ["error"] and set(body["error"]) == {"type", "message"}
    return body["error"]


# -- where it listens ---------------------------------------------------------------------------------


def test_the_server_binds_loopback_by_default(served_server):
    _, server, _ = served_server
    assert ServerSettings().host == "127.0.0.1"
    assert server.server.servers[0].sockets[0].getsockname()[0] == "127.0.0.1"
    assert server.url.startswith("http://127.0.0.1:")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "example.org"])
def test_another_address_without_a_token_refuses_to_start(host, monkeypatch):
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    settings = ServerSettings(host=host, port=0)
    with pytest.raises(
        ValueError, match=f"binding '{host}' lets other machines reach this server: give a token"
    ):
        settings.check()
    with pytest.raises(ValueError, match="give a token with --token or MODULAR_SERVE_TOKEN"):
        start_server(object(), settings)  # refused before anything listens
    ServerSettings(host=host, token=TOKEN).check()  # a token (or the variable) lets it start
    monkeypatch.setenv(TOKEN_VARIABLE, TOKEN)
    settings.check()


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_needs_no_token(host, monkeypatch):
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    ServerSettings(host=host).check()


def test_a_short_token_is_refused():
    with pytest.raises(ValueError, match="a token must be at least 16 characters"):
        ServerSettings(token="short").check()


def test_the_command_refuses_another_address_without_a_token_in_one_line(tiny_repos, monkeypatch, capsys):
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    assert main(["serve", str(tiny_repos.sd), "--host", "0.0.0.0", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "modular: error: ValueError: binding '0.0.0.0' lets other machines reach this server: give a token "
        "with --token or MODULAR_SERVE_TOKEN, or bind 127.0.0.1\n"
    )


# -- the token ----------------------------------------------------------------------------------------

ROUTES = [
    ("GET", "/"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/v1/jobs"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs/{job}"),
    ("GET", "/v1/jobs/{job}/result"),
    ("GET", "/v1/jobs/{job}/events"),
    ("DELETE", "/v1/jobs/{job}"),
    ("GET", "/v1/events"),
    ("GET", "/v1/manager"),
    ("GET", "/v1/memory"),
    ("GET", "/v1/workflows"),
    ("GET", "/v1/queue"),
    ("POST", "/v1/queue/pause"),
    ("POST", "/v1/queue/resume"),
    ("GET", "/no-such-route"),
]


def _send(client: httpx.Client, method: str, path: str, **options: Any) -> int:
    """The status of one request (a stream's status line only: its events are not read)."""
    body = {"json": request()} if (method, path) == ("POST", "/v1/jobs") else {}
    with client.stream(method, path, **body, **options) as response:
        return response.status_code


@pytest.fixture
def guarded(serve):
    """A server with a token, a client that does not send it, and one finished job."""
    running = serve(token=TOKEN, authorize=False)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    job_id = running.client.post("/v1/jobs", json=request(), headers=headers).json()["id"]
    with httpx.Client(base_url=running.server.url, headers=headers) as client:
        wait_for_state(client, job_id)
    return running, job_id


def test_with_a_token_every_route_but_health_is_401_without_it(guarded):
    (_, _, client), job_id = guarded
    for method, template in ROUTES:
        path = template.format(job=job_id)
        for headers in ({}, {"Authorization": "Bearer wrong-token-of-some-length"}, {"Authorization": TOKEN}):
            response = client.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path, headers)
            assert response.headers["www-authenticate"] == "Bearer"
            assert error_of(response) == {
                "type": "Unauthorized",
                "message": "this server needs its token: send 'Authorization: Bearer <token>'",
            }
        wrong = client.request(method, path, params={"token": TOKEN[:-1] + "y"})
        assert wrong.status_code == 401, (method, path)
    assert client.get("/healthz").json() == {"ok": True}


def test_with_the_token_as_a_header_or_a_parameter_every_route_answers(guarded):
    (scheduler, _, client), job_id = guarded
    expected = {("GET", "/no-such-route"): 404, ("POST", "/v1/jobs"): 202, ("DELETE", "/v1/jobs/{job}"): 409}
    for method, template in ROUTES:
        path = template.format(job=job_id)
        status = expected.get((method, template), 200)
        assert _send(client, method, path, headers={"Authorization": f"Bearer {TOKEN}"}) == status, path
        assert _send(client, method, path, params={"token": TOKEN}) == status, path
    assert scheduler.wait_idle(120)


def test_the_token_is_compared_in_constant_time(serve, monkeypatch):
    """Every request but health goes through ``hmac.compare_digest`` with the token given and the server's."""
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(given: bytes, token: bytes) -> bool:
        compared.append((given, token))
        return real(given, token)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    _, _, client = serve(token=TOKEN, authorize=False, start=False)
    assert (
        client.get("/v1/queue", headers={"Authorization": "Bearer guess-of-another-length"}).status_code
        == 401
    )
    assert client.get("/v1/queue", params={"token": TOKEN}).status_code == 200
    assert client.get("/healthz").status_code == 200
    assert compared == [(b"guess-of-another-length", TOKEN.encode()), (TOKEN.encode(), TOKEN.encode())]


# -- what a request may name --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "workflow",
    ["stabilityai/stable-diffusion-2-1", "hf-internal-testing/tiny-sd", "/etc", "./tiny-sd", "tiny-sd:x"],
)
def test_a_request_naming_a_hub_id_or_a_path_is_refused_naming_the_served_workflows(served_server, workflow):
    scheduler, _, client = served_server
    response = client.post("/v1/jobs", json=request(workflow=workflow))
    assert response.status_code == 400
    assert error_of(response) == {
        "type": "RequestError",
        "message": f"request: 'workflow' {workflow!r} is not served here; this server serves {SERVED}",
    }
    assert scheduler.jobs() == []


def test_a_request_naming_an_existing_repo_folder_is_refused(served_server, tiny_repos):
    scheduler, _, client = served_server
    response = client.post("/v1/jobs", json=request(workflow=str(tiny_repos.sd)))
    assert response.status_code == 400 and f"this server serves {SERVED}" in error_of(response)["message"]
    assert scheduler.jobs() == []


@pytest.mark.parametrize(
    "key",
    [
        "repo",
        "revision",
        "variant",
        "trust_remote_code",
        "custom_pipeline",
        "pretrained_model_name_or_path",
        "dtype",
    ],
)
def test_a_request_setting_where_models_come_from_is_refused(served_server, key):
    scheduler, _, client = served_server
    response = client.post(
        "/v1/jobs", json=request(**{key: "evil/repo" if key != "trust_remote_code" else True})
    )
    assert response.status_code == 400
    assert error_of(response)["message"] == (
        f"request: a request cannot set {key!r}: it names one of the workflows this server was started with as "
        f"'workflow' ({SERVED})"
    )
    assert scheduler.jobs() == []


def test_remote_code_as_a_call_input_is_an_unknown_input(served_server):
    _, _, client = served_server
    response = client.post("/v1/jobs", json=request(inputs={"trust_remote_code": True}))
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "UnknownInputError" and "'trust_remote_code'" in error["message"]


# -- limits -------------------------------------------------------------------------------------------


def test_a_body_over_max_body_is_413(serve):
    scheduler, _, client = serve(settings=ServerSettings(port=0, max_body=1000), start=False)
    big = request(prompt="x" * 2000)
    response = client.post("/v1/jobs", json=big)
    assert response.status_code == 413
    assert "this server takes at most 1000" in error_of(response)["message"]

    def chunks():  # no Content-Length: counted as it arrives
        data = json.dumps(big).encode()
        for start in range(0, len(data), 100):
            yield data[start : start + 100]

    streamed = client.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert (
        error_of(streamed)["message"]
        == "the request body is more than 1000 bytes; this server takes at most 1000"
    )
    assert scheduler.jobs() == []
    assert client.post("/v1/jobs", json=request()).status_code == 202  # a small one still goes


@pytest.mark.parametrize("how", ["file", "base64"])
def test_an_image_over_max_upload_is_413(serve, how):
    image = noise_png()
    scheduler, _, client = serve(settings=ServerSettings(port=0, max_upload=len(image) - 1), start=False)
    job = request(inputs={"strength": 0.5})
    if how == "file":
        response = client.post(
            "/v1/jobs", data={"request": json.dumps(job)}, files={"image": ("a.png", image, "image/png")}
        )
    else:
        response = client.post(
            "/v1/jobs", json={**job, "images": {"image": base64.b64encode(image).decode()}}
        )
    assert response.status_code == 413
    assert error_of(response)["message"] == (
        f"image 'image' is {len(image)} bytes; this server takes at most {len(image) - 1}"
    )
    assert scheduler.jobs() == [] and list(scheduler.uploads.glob("*")) == []


def test_an_image_over_max_pixels_is_refused_from_its_header_without_decoding(serve, monkeypatch):
    """A 5000x5000 PNG of a few kilobytes (one colour compresses well) is refused by the size its header
    states: no pixel is decoded."""
    huge = png(PIL.Image.new("1", (5000, 5000)))
    assert len(huge) < 100_000
    decodes: list[Any] = []
    real_load = PIL.ImageFile.ImageFile.load

    def load(image: Any) -> Any:
        decodes.append(image.size)
        return real_load(image)

    monkeypatch.setattr(PIL.ImageFile.ImageFile, "load", load)
    scheduler, _, client = serve(start=False)
    response = client.post(
        "/v1/jobs",
        data={"request": json.dumps(request(inputs={"strength": 0.5}))},
        files={"image": ("big.png", huge, "image/png")},
    )
    assert response.status_code == 400
    assert error_of(response) == {
        "type": "RequestError",
        "message": "request: image 'image' is 5000x5000; this server takes at most 4194304 pixels",
    }
    assert decodes == [] and scheduler.jobs() == []


@pytest.mark.parametrize(
    ("more", "message"),
    [
        ({"steps": 4}, "'steps' must be at most 3 on this server (got 4)"),
        ({"images_per_prompt": 3}, "a request makes at most 2 images on this server (got 3)"),
        ({"seeds": [1, 2, 3]}, "a request makes at most 2 images on this server (got 3)"),
        ({"size": "64x64"}, "'size' 64x64 is 4096 pixels; this server makes at most 1024"),
    ],
    ids=["steps", "images", "seeds", "pixels"],
)
def test_a_request_past_the_limits_is_400(serve, more, message):
    scheduler, _, client = serve(limits=Limits(max_steps=3, max_images=2, max_pixels=1024), start=False)
    data = {**request(), **more}
    if "seeds" in more:
        del data["seed"]
    response = client.post("/v1/jobs", json=data)
    assert response.status_code == 400
    assert error_of(response) == {"type": "RequestError", "message": f"request: {message}"}
    assert scheduler.jobs() == []


def test_a_full_queue_is_429_with_retry_after(served_server):
    scheduler, _, client = served_server
    scheduler.max_queue = 2
    assert client.post("/v1/queue/pause").status_code == 200
    accepted = [client.post("/v1/jobs", json=request(seed=seed)).status_code for seed in (1, 2)]
    refused = client.post("/v1/jobs", json=request(seed=3))
    assert accepted == [202, 202] and refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    assert error_of(refused) == {
        "type": "QueueFullError",
        "message": f"the queue is full (2 jobs wait); try again in about {refused.headers['retry-after']} s",
    }
    assert len(client.get("/v1/jobs").json()) == 2  # the refused job is not stored
    client.post("/v1/queue/resume")
    assert scheduler.wait_idle(120)


# -- names the server makes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "job_id",
    ["..", "..%2F..%2Fetc%2Fpasswd", "%2E%2E%2F%2E%2E%2Fjobs.sqlite", "..%5C..%5Cjobs.sqlite", "%00"],
)
def test_a_result_is_read_by_job_id_never_by_a_path(served_server, job_id):
    scheduler, _, client = served_server
    (scheduler.state / "results" / "secret.png").parent.mkdir(parents=True, exist_ok=True)
    (scheduler.state / "results" / "secret.png").write_bytes(b"not for clients")
    response = client.get(f"/v1/jobs/{job_id}/result", params={"index": 0})
    assert response.status_code == 404
    assert error_of(response)["type"] in ("UnknownJobError", "HTTPError")
    assert b"not for clients" not in response.content and b"SQLite" not in response.content
    for name in ("secret", "..%2Fsecret", "..%2Fresults%2Fsecret"):
        assert client.get(f"/v1/jobs/{name}/result").status_code == 404


def test_results_and_uploads_have_names_the_server_made(served_server):
    """A client's file name is never used: the upload is stored by its sha256, the result by job id."""
    scheduler, _, client = served_server
    image = noise_png()
    accepted = client.post(
        "/v1/jobs",
        data={"request": json.dumps(request(inputs={"strength": 0.5}))},
        files={"image": ("../../evil.png", image, "image/png")},
    )
    assert accepted.status_code == 202, accepted.json()
    job_id = accepted.json()["id"]
    assert wait_for_state(client, job_id)["state"] == "done"
    assert [path.name for path in scheduler.uploads.iterdir()] == [f"{hashlib.sha256(image).hexdigest()}.png"]
    assert [path.name for path in scheduler.results.iterdir()] == [f"{job_id}-0.png"]
    assert not list(Path(scheduler.state).parent.rglob("evil.png"))


# -- errors -------------------------------------------------------------------------------------------


def _batch_error(tmp_path: Path, capsys: Any, repo: Path, **keys: Any) -> str:
    """What ``modular batch --dry-run`` says of a job file with ``keys``: the message after the file's name."""
    job = {"output": "out", "prompts": ["a red fox"], "workflows": [{"name": SD, "repo": str(repo)}], **keys}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    assert main(["batch", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    prefix = f"modular: error: JobFileError: {path}: "
    assert err.startswith(prefix) and err.count("\n") == 1
    return err[len(prefix) : -1]


@pytest.mark.parametrize(
    "keys",
    [{"step": 2}, {"steps": 0, "images_per_prompt": 0}, {"guidance_scale": "high"}, {"seeds": [-1]}],
    ids=["misspelt", "two-problems", "type", "seeds"],
)
def test_a_bad_request_has_the_message_modular_batch_gives(served_server, tiny_repos, tmp_path, capsys, keys):
    _, _, client = served_server
    expected = _batch_error(tmp_path, capsys, tiny_repos.sd, **keys)
    data = {"workflow": SD, "prompt": "a red fox", **keys}
    response = client.post("/v1/jobs", json=data)
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "RequestError"
    assert error["message"] == f"request: {expected}"


def test_an_unknown_input_has_the_message_of_the_command_line(served_server, tiny_repos, tmp_path, capsys):
    _, _, client = served_server
    job = {
        "output": "out",
        "prompts": ["a red fox"],
        "workflows": [{"name": SD, "repo": str(tiny_repos.sd), "inputs": {"strenght": 0.5}}],
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    assert main(["batch", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("modular: error: UnknownInputError: ")
    response = client.post("/v1/jobs", json=request(inputs={"strenght": 0.5}))
    assert response.status_code == 400
    error = error_of(response)
    assert error["type"] == "UnknownInputError"
    assert error["message"].splitlines()[0] == err[len("modular: error: UnknownInputError: ") : -1]


@pytest.mark.parametrize(
    ("method", "path", "options", "status"),
    [
        ("POST", "/v1/jobs", {"content": b"{not json"}, 400),
        ("POST", "/v1/jobs", {"content": b"[1, 2]"}, 400),
        ("POST", "/v1/jobs", {"content": b"a=1", "headers": {"content-type": "text/plain"}}, 415),
        ("PUT", "/v1/jobs", {}, 405),
        ("GET", "/v1/nothing", {}, 404),
        ("GET", "/v1/jobs/x/result", {"params": {"index": "-1"}}, 400),
        ("GET", "/v1/manager", {"params": {"format": "yaml"}}, 400),
    ],
)
def test_every_error_is_json(served_server, method, path, options, status):
    _, _, client = served_server
    response = client.request(method, path, **options)
    assert response.status_code == status
    assert error_of(response)["message"]


def test_an_exception_inside_the_app_is_500_json_without_a_traceback(served_server, monkeypatch):
    scheduler, _, client = served_server

    def broken(*args: Any) -> Any:
        raise RuntimeError("a secret detail at /srv/models/private")

    monkeypatch.setattr(scheduler, "jobs", broken)
    response = client.get("/v1/jobs")
    assert response.status_code == 500
    assert error_of(response) == {
        "type": "InternalError",
        "message": "the server met an error; its log has the details",
    }
    assert "Traceback" not in response.text and "secret" not in response.text
    assert client.get("/healthz").status_code == 200  # the server goes on
