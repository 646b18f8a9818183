"""``modular serve`` as a user runs it: a subprocess that prints its URL, serves a job over HTTP, and stops
cleanly on SIGTERM or SIGINT (a running job is requeued for the next start); its refusals are one line and
exit status 2."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from components import ComponentsManager
from modular.cli.args import SERVE_STATE
from modular.cli.main import build_parser, main
from modular.cli.serve_command import SERVE_EXTRA, serve_command
from modular.http.settings import TOKEN_VARIABLE
from tests.http.helpers import SD, read_events, wait_for_state

ROOT = Path(__file__).resolve().parents[2]
URL = re.compile(r"listening on (http://127\.0\.0\.1:\d+) ")
START_TIMEOUT = 180  # seconds for imports and binding on a loaded machine; a bound, not a measure
STOP_TIMEOUT = 60


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop(TOKEN_VARIABLE, None)
    return env


class ServeProcess:
    """``python -m modular serve ...`` with its stdout lines read in a thread (so reads are bounded)."""

    def __init__(self, args: list[str], cwd: Path, number: int) -> None:
        self.errors = cwd / f"serve-{number}.stderr"
        with self.errors.open("w") as errors:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "modular", "serve", *args],
                cwd=cwd,
                env=_env(),
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.said: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, timeout: float) -> str:
        line = self.lines.get(timeout=timeout)
        if line is None:
            self.process.wait(STOP_TIMEOUT)
            pytest.fail(f"modular serve ended (status {self.process.returncode}): {self.errors.read_text()}")
        self.said.append(line)
        return line

    def url(self) -> str:
        found = URL.search(self.next_line(START_TIMEOUT))
        assert found, self.said
        return found.group(1)

    def stop(self, number: int = signal.SIGTERM) -> tuple[int, list[str], str]:
        """Send ``number``; the exit status, the lines said after the first, and stderr."""
        self.process.send_signal(number)
        self.process.wait(STOP_TIMEOUT)
        self._reader.join(STOP_TIMEOUT)
        rest: list[str] = []
        while (line := self.lines.get_nowait()) is not None:
            rest.append(line)
        return self.process.returncode, rest, self.errors.read_text()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT)
        self._reader.join(STOP_TIMEOUT)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def start_serve(tmp_path: Path) -> Iterator[Any]:
    started: list[ServeProcess] = []

    def start(*args: str) -> ServeProcess:
        process = ServeProcess(list(args), tmp_path, len(started))
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


def request(**more: Any) -> dict[str, Any]:
    return {"workflow": SD, "prompt": "a red fox", "steps": 2, "size": "32x32", "seed": 11, **more}


@pytest.mark.slow  # a server process started (imports, binding): seconds
def test_serve_runs_a_job_and_stops_on_sigterm(start_serve, tiny_repos, tmp_path, direct):
    serving = start_serve(f"{SD}={tiny_repos.sd}", "--port", "0", "--state", "state", "--threads", "1")
    url = serving.url()
    assert serving.said[0].endswith(f"({SD}; models on cpu); the page: {url}/")
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/healthz").json() == {"ok": True}
        accepted = client.post("/v1/jobs", json=request())
        assert accepted.status_code == 202
        job = wait_for_state(client, accepted.json()["id"])
        assert job["state"] == "done", job["error"]
        result = client.get(f"/v1/jobs/{job['id']}/result").content
    assert result == direct(SD, 11, prompt="a red fox", num_inference_steps=2, width=32, height=32)
    with watching_the_queue(url) as watcher:  # a page left open does not keep the server up
        status, rest, err = serving.stop(signal.SIGTERM)
    assert status == 0 and "Traceback" not in err, err
    assert rest == [f"modular serve: stopped; 0 jobs wait in {tmp_path / 'state'} for the next start"]
    assert (tmp_path / "state" / "results" / f"{job['id']}-0.png").read_bytes() == result
    assert not watcher.is_alive()


@contextlib.contextmanager
def watching_the_queue(url: str) -> Iterator[threading.Thread]:
    """A client reading ``/v1/events`` in a thread until the server ends the stream (or drops it)."""
    opened = threading.Event()

    def watch() -> None:
        with contextlib.suppress(httpx.HTTPError), httpx.Client(base_url=url, timeout=STOP_TIMEOUT) as client:
            with client.stream("GET", "/v1/events") as response:
                opened.set()
                for _ in response.iter_lines():
                    pass

    thread = threading.Thread(target=watch, name="queue-watcher")
    thread.start()
    assert opened.wait(START_TIMEOUT)
    try:
        yield thread
    finally:
        thread.join(STOP_TIMEOUT)


@pytest.mark.slow  # a server process started (imports, binding): seconds
def test_a_job_running_at_sigterm_runs_again_at_the_next_start(start_serve, tiny_repos, tmp_path):
    """SIGTERM cancels the running job as the server's own stop (not a client's): it is queued again in the
    state folder, and the next server over that folder starts it again (its second attempt)."""
    served = f"{SD}={tiny_repos.sd}"
    first = start_serve(served, "--port", "0", "--state", "state", "--threads", "1")
    with httpx.Client(base_url=first.url(), timeout=60) as client:
        job_id = client.post("/v1/jobs", json=request(steps=200, images_per_prompt=8)).json()["id"]
        wait_for_state(client, job_id, ("running",))
    status, rest, err = first.stop(signal.SIGTERM)
    assert status == 0 and "Traceback" not in err, err
    assert rest == [f"modular serve: stopped; 1 job waits in {tmp_path / 'state'} for the next start"]
    second = start_serve(served, "--port", "0", "--state", "state", "--threads", "1")
    with httpx.Client(base_url=second.url(), timeout=60) as client:
        job = wait_for_state(client, job_id, ("running",))
        assert job["attempts"] == 2 and job["error"] is None
        assert client.delete(f"/v1/jobs/{job_id}").status_code == 202  # no need to wait for 1600 steps
        assert wait_for_state(client, job_id)["state"] == "cancelled"
    status, rest, err = second.stop(signal.SIGINT)  # Ctrl-C stops it the same way
    assert status == 0 and "Traceback" not in err, err
    assert rest == [f"modular serve: stopped; 0 jobs wait in {tmp_path / 'state'} for the next start"]


def _refusal(args: list[str], cwd: Path) -> str:
    """``modular serve *args`` in a subprocess: it must exit 2 with one line on stderr and nothing on stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "modular", "serve", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    assert done.returncode == 2, done
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    return done.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "modular serve: error: the following arguments are required: REPO_OR_WORKFLOW\n"),
        (
            ["{sd}", "--host", "0.0.0.0"],
            "modular: error: ValueError: binding '0.0.0.0' lets other machines reach this server: give a token "
            "with --token or MODULAR_SERVE_TOKEN, or bind 127.0.0.1\n",
        ),
        (
            ["./no-such-folder"],
            "modular: error: FileNotFoundError: './no-such-folder' is not a folder on disk, nor a hub repo id "
            "like 'org/name'; check the path\n",
        ),
        (
            ["{sd}", "--port", "70000"],
            "modular serve: error: argument --port: must be a port from 0 to 65535 (got '70000')\n",
        ),
    ],
    ids=["no-repo", "host-without-token", "unknown-folder", "bad-port"],
)
def test_a_refusal_is_one_line_and_status_2(tiny_repos, tmp_path, args, said):
    args = [arg.format(sd=tiny_repos.sd) for arg in args]
    assert _refusal([*args, "--state", "state"], tmp_path) == said
    assert not (tmp_path / "state").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["a="], "ValueError: a served workflow is REPO, REPO:WORKFLOW or NAME=REPO[:WORKFLOW] (got 'a=')"),
        (
            ["{sd}", "--offload", "sim"],
            "ValueError: --offload sim needs --budget: the simulated device's size",
        ),
        (
            ["{sd}", "--offload", "none", "--host-budget", "1GB"],
            "ValueError: --host-budget needs auto offload, which --offload none turns off; drop one of them",
        ),
        (["{sd}", "--token", "short"], "ValueError: a token must be at least 16 characters"),
        (
            ["{sd}", "{sd}"],
            "ValueError: served workflow names must be unique (got ['tiny-sd'] more than once)",
        ),
    ],
    ids=["bad-served", "sim-without-budget", "host-budget-without-offload", "short-token", "twice"],
)
def test_a_refused_option_is_one_line_in_process(tiny_repos, tmp_path, capsys, monkeypatch, args, said):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    args = [arg.format(sd=f"{SD}={tiny_repos.sd}") for arg in args]
    assert main(["serve", *args, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"modular: error: {said}") and err.count("\n") == 1
    assert not (tmp_path / SERVE_STATE).exists()


@pytest.mark.parametrize("missing", ["fastapi", "uvicorn", "python_multipart"])
def test_without_the_serve_extra_it_says_how_to_install_it(tiny_repos, capsys, monkeypatch, missing):
    """The import failing (as it does where the extra is not installed) is one line naming the extra."""
    monkeypatch.setitem(sys.modules, missing, None)  # `import <missing>` now raises ImportError
    if missing == "python_multipart":
        monkeypatch.setitem(sys.modules, "multipart", None)
    assert main(["serve", str(tiny_repos.sd)]) == 2
    shown = "python-multipart" if missing == "python_multipart" else missing
    assert capsys.readouterr().err == (
        f"modular: error: ImportError: modular serve needs {shown}, which is not installed: {SERVE_EXTRA}\n"
    )
    assert SERVE_EXTRA == 'pip install "modular-pipelines[serve]"'


def test_the_defaults_said_in_the_help_are_the_servers(capsys):
    """``modular serve REPO`` leaves unset what the classes default, and the help says those defaults."""
    from modular.cli.serve_command import server_settings
    from modular.http.settings import ServerSettings
    from modular.serving import Fairness, Limits, Scheduler

    args = build_parser().parse_args(["serve", "repo"])
    assert (args.host, args.port, args.state) == ("127.0.0.1", 8188, None)  # None: ./SERVE_STATE
    assert server_settings(args) == ServerSettings()
    with pytest.raises(SystemExit) as stop:
        main(["serve", "--help"])
    assert stop.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    limits, fairness, settings = Limits(), Fairness(), ServerSettings()
    for said in (
        f"(default {limits.max_steps})",
        f"(default {limits.max_images})",
        f"(default {limits.max_pixels}: 2048x2048)",
        f"(default {fairness.max_wait:g})",
        f"(default {fairness.max_bypass})",
        f"(default {settings.max_body // 1024**2}MiB)",
        f"(default {settings.max_upload // 1024**2}MiB)",
        f"(default {Scheduler.__init__.__kwdefaults__['max_queue']})",
        f"(default {Scheduler.__init__.__kwdefaults__['preview_every']}; 0: no previews)",
        f"(default ./{SERVE_STATE}; not with --ray)",
    ):
        assert said in help_text, said


@contextlib.contextmanager
def serving_in_a_thread(argv: list[str]) -> Iterator[tuple[str, str]]:
    """``serve_command`` of ``modular serve *argv`` in a thread (no signals there; a stop event instead);
    inside: its start line and URL. Stopped and joined on leaving; an error in it fails the test."""
    args = build_parser().parse_args(["serve", *argv])
    said: queue.Queue[str] = queue.Queue()
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            serve_command(args, said.put, stop)
        except BaseException as error:  # reported by the test's thread
            failed.append(error)
            said.put("")

    thread = threading.Thread(target=run, name="serve-command")
    thread.start()
    try:
        line = said.get(timeout=START_TIMEOUT)
        assert not failed, failed
        found = URL.search(line)
        assert found, line
        yield line, found.group(1)
    finally:
        stop.set()
        thread.join(STOP_TIMEOUT)
        assert not thread.is_alive() and not failed, failed
    assert said.get_nowait().startswith("modular serve: stopped; 0 jobs wait")


def test_the_options_reach_the_server(tiny_repos, tmp_path, monkeypatch):
    """Simulated offload with a budget and a host budget, the queue's length, the steps limit and no
    previews: each is what the running server does."""
    offloads: list[dict[str, Any]] = []
    enable = ComponentsManager.enable_auto_cpu_offload

    def spy(manager: ComponentsManager, *args: Any, **options: Any) -> None:
        offloads.append(options)
        enable(manager, *args, **options)

    monkeypatch.setattr(ComponentsManager, "enable_auto_cpu_offload", spy)
    argv = [f"{SD}={tiny_repos.sd}", "--port", "0", "--state", str(tmp_path / "state"), "--offload", "sim"]
    argv += ["--budget", "64MB", "--host-budget", "1GB", "--max-queue", "3", "--max-steps", "5"]
    argv += ["--preview-every", "0", "--threads", "1"]
    with serving_in_a_thread(argv) as (line, url), httpx.Client(base_url=url, timeout=60) as client:
        assert "models on a simulated device under auto offload" in line
        (device,) = client.get("/v1/memory").json()["devices"]
        assert device["total"] == 64 * 10**6
        assert [options["host_budget"] for options in offloads] == [10**9]
        assert offloads[0]["memory_reserve_margin"] == 0
        assert client.get("/v1/queue").json()["max_queue"] == 3
        refused = client.post("/v1/jobs", json=request(steps=6))
        assert (
            refused.json()["error"]["message"] == "request: 'steps' must be at most 5 on this server (got 6)"
        )
        job_id = client.post("/v1/jobs", json=request()).json()["id"]
        assert wait_for_state(client, job_id)["state"] == "done"
        kinds = [event["kind"] for event in read_events(client, f"/v1/jobs/{job_id}/events")]
        assert "step" in kinds and "preview" not in kinds
        assert client.get("/v1/memory").json()["devices"][0]["samples"]  # the offload log, from the job


def test_with_a_token_the_line_says_where_the_page_is_but_not_the_token(tiny_repos, tmp_path):
    token = "a-token-of-more-than-16-characters"
    argv = [str(tiny_repos.sd), "--port", "0", "--state", str(tmp_path / "state"), "--token", token]
    with serving_in_a_thread(argv) as (line, url), httpx.Client(base_url=url, timeout=60) as client:
        assert line.endswith(f"the page: {url}/?token=<your token>") and token not in line
        assert client.get("/v1/queue").status_code == 401
        assert client.get("/v1/queue", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert [
            workflow["name"] for workflow in client.get("/v1/workflows", params={"token": token}).json()
        ] == ["tiny-sd"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here: --offload auto runs")
def test_offload_auto_without_cuda_is_one_line(tiny_repos, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["serve", str(tiny_repos.sd), "--offload", "auto", "--port", "0"]) == 2
    assert capsys.readouterr().err == (
        "modular: error: ValueError: offload 'auto' moves models onto CUDA, but this process's device is cpu; "
        "use 'sim' with a budget\n"
    )
    assert not (tmp_path / SERVE_STATE).exists()


def test_a_port_in_use_is_one_line(tiny_repos, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(tiny_repos.sd), "--port", str(port)]) == 2
    assert capsys.readouterr().err == (
        f"modular: error: OSError: cannot listen on 127.0.0.1:{port} (Address already in use); choose another "
        "--port, or 0 for a free one\n"
    )
