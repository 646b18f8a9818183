"""Requests that once broke the server (found by fuzzing and by hand): each is refused with 400 and the
fault named, and the server goes on answering everyone else. The queue's worker is not started: nothing
here needs a job to run."""

from __future__ import annotations

import json
import threading

import pytest

from tests.http.load_helpers import SD, make_repos, serving


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repos = make_repos(tmp_path_factory.mktemp("repos"))
    with serving(repos, tmp_path_factory.mktemp("state"), start=False) as served:
        yield served


@pytest.fixture
def http(served):
    with served.client() as client:
        yield client


def _refused(http, body: bytes | dict) -> str:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = http.post("/v1/jobs", content=content, headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert http.get("/v1/jobs").status_code == 200  # the list of jobs still answers
    return answer.json()["error"]["message"]


def test_a_priority_past_64_bits_is_refused_not_a_server_error(http):
    """SQLite stores a priority in 64 bits: a larger one was a 500 when the job was written."""
    message = _refused(http, {"workflow": SD, "prompt": "a fox", "priority": 10**30})
    assert (
        message == "request: 'priority' must be from -2**63 to 2**63-1 (got 1000000000000000000000000000000)"
    )


def test_a_huge_image_count_is_refused_before_its_entries_are_made(http):
    """``images_per_prompt`` of 10**30 made the batch check build every entry, which held the server."""
    message = _refused(http, {"workflow": SD, "prompt": "a fox", "images_per_prompt": 10**30})
    assert message.endswith(
        "a request makes at most 8 images on this server (got 1000000000000000000000000000000)"
    )


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_numbers_json_has_not_are_refused(http, constant):
    """Python's json reads NaN and Infinity; a job holding one made every later GET /v1/jobs a 500."""
    body = f'{{"workflow": "{SD}", "prompt": "a fox", "guidance_scale": {constant}}}'.encode()
    assert _refused(http, body) == f"the request is not JSON ({constant} is no JSON number)"


def test_a_lone_surrogate_is_refused(http):
    """A prompt of half a UTF-16 pair was accepted, and every later GET /v1/jobs was a 500."""
    body = b'{"workflow": "tiny-sd", "prompt": "\\ud800 fox"}'
    message = _refused(http, body)
    assert (
        message
        == "the request is not JSON text (it holds '\\ud800', half of a UTF-16 pair, which is no character)"
    )
    pair = (
        b'{"workflow": "tiny-sd", "prompt": "\\ud83e\\udd8a fox", "steps": 1}'  # a whole pair is a character
    )
    assert (
        http.post("/v1/jobs", content=pair, headers={"content-type": "application/json"}).status_code == 202
    )


def test_a_timeout_longer_than_a_timer_can_wait_is_refused(http, served):
    """A timeout of 1e308 s was accepted and its timer's thread died; NaN (from Python) is refused too."""
    message = _refused(http, {"workflow": SD, "prompt": "a fox", "timeout": 1e308})
    assert (
        message
        == f"request: 'timeout' must be more than 0 and at most {threading.TIMEOUT_MAX:.0f} seconds (got 1e+308)"
    )
    with pytest.raises(ValueError, match="'timeout' must be more than 0"):
        served.scheduler.check({"workflow": SD, "prompt": "a fox", "timeout": float("nan")})


def test_an_input_set_by_a_request_key_names_the_request_key(http):
    """The batch check's message named the job file's keys ('sizes', 'prompts'); a request has 'size', 'prompt'."""
    message = _refused(http, {"workflow": SD, "prompt": "a fox", "inputs": {"height": 64}})
    assert (
        message == "request: 'inputs' sets 'height', which the job sets through its key 'size'; use that key"
    )
    message = _refused(http, {"workflow": SD, "prompt": "a fox", "inputs": {"prompt": "a cat"}})
    assert (
        message
        == "request: 'inputs' sets 'prompt', which the job sets through its key 'prompt'; use that key"
    )


def test_a_submit_in_progress_does_not_hold_up_other_requests(served, http, monkeypatch):
    """The check and the store's synced write run off the event loop: while one submit is held, the server
    answers another request."""
    released, entered = threading.Event(), threading.Event()
    released_in_time: list[bool] = []  # False: the submit gave up waiting, so the other answer came after it
    submit = served.scheduler.submit

    def held_submit(*args, **kwargs):
        entered.set()
        released_in_time.append(released.wait(10))
        return submit(*args, **kwargs)

    monkeypatch.setattr(served.scheduler, "submit", held_submit)
    answers = []
    poster = threading.Thread(
        target=lambda: answers.append(http.post("/v1/jobs", json={"workflow": SD, "prompt": "a fox"}))
    )
    poster.start()
    try:
        assert entered.wait(10)
        with served.client() as other:
            assert other.get("/healthz").json() == {"ok": True}
    finally:
        released.set()
        poster.join(30)
    assert released_in_time == [True]
    assert answers[0].status_code == 202


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[" * 50_000, "the request is not JSON this server takes (it nests too deep)"),
        (
            b'{"prompt": "a fox", "seed": ' + b"9" * 5000 + b"}",
            "the request is not JSON this server takes (a number of too many digits)",
        ),
        (
            b'{"prompt": "a fox", "guidance_scale": 1e999}',
            "the request is not JSON this server takes (1e999 is past a 64-bit float)",
        ),
    ],
    ids=["deep", "digits", "1e999"],
)
def test_json_python_cannot_read_or_answer_is_refused(http, body, message):
    """Nesting past Python's recursion limit and integers past its digit limit were 500s; 1e999 read as
    infinity, which made GET /v1/jobs a 500."""
    assert _refused(http, body) == message
