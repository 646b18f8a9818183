"""``modular serve --ray``: its refusals are one line and status 2, before Ray starts (those of the options run
everywhere, Ray installed or not); and as a user runs it, a subprocess on a local Ray cluster that prints its
URL, serves a job over HTTP with its token, and stops on SIGINT."""

from __future__ import annotations

import signal
import sys

import httpx
import pytest

from modular.cli.main import main
from modular.cli.serve_command import RAY_EXTRA
from modular.http.settings import TOKEN_VARIABLE
from tests.http.helpers import wait_for_state

RAY_REASON = 'needs Ray Serve: pip install "modular-pipelines[ray]"'
TOKEN = "a-token-of-more-than-16-characters"


@pytest.fixture
def without_ray(monkeypatch):
    """``import ray`` raises ImportError, as where Ray is missing (so nothing here can start it)."""
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.serve", None)


def refusal(argv, capsys) -> str:
    """What ``modular serve *argv`` says on stderr, checked to be one line with status 2."""
    try:
        status = main(["serve", *argv])
    except SystemExit as stop:  # argparse's refusals
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, (status, err)
    return err


def test_without_ray_it_says_how_to_install_it(tmp_path, capsys, monkeypatch, without_ray):
    monkeypatch.chdir(tmp_path)
    assert refusal(["--ray", "./tiny-sd"], capsys) == (
        'modular serve: error: --ray needs Ray Serve: pip install "modular-pipelines[ray]"\n'
    )
    assert RAY_EXTRA == 'pip install "modular-pipelines[ray]"'
    assert list(tmp_path.iterdir()) == []  # nothing started, no state folder


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--replicas", "3"], "ValueError: --replicas is an option of --ray: add --ray, or drop it"),
        (
            ["--autoscale", "1:4", "--tries", "2", "--ray-address", "auto"],
            "ValueError: --ray-address, --autoscale and --tries are options of --ray: add --ray, or drop them",
        ),
        (
            [
                "--gpus-per-replica",
                "0.5",
                "--cpus-per-replica",
                "2",
                "--imbalance",
                "0",
                "--stats-period",
                "2",
            ],
            "ValueError: --gpus-per-replica, --cpus-per-replica, --imbalance and --stats-period are options of "
            "--ray: add --ray, or drop them",
        ),
        (
            ["--ray", "--state", "jobs"],
            "ValueError: --state does not apply with --ray (the ingress keeps jobs in memory); drop it",
        ),
        (
            ["--ray", "--offload", "sim", "--margin", "0", "--host-budget", "1GB"],
            "ValueError: --offload, --margin and --host-budget do not apply with --ray (each replica offloads "
            "onto a simulated device of --budget, else onto its own GPU); drop them",
        ),
        (
            ["--ray", "--threads", "2", "--state", "jobs"],
            "ValueError: --state and --threads do not apply with --ray (the ingress keeps jobs in memory; Ray "
            "gives each replica its threads by --cpus-per-replica); drop them",
        ),
        (
            ["--ray", "--ray-address", "auto", "--port", "0"],
            "ValueError: --port 0 picks a free port of this machine, but on a joined cluster (--ray-address) "
            "Ray Serve's proxies listen on every node: give a --port",
        ),
    ],
    ids=["replicas", "three", "four", "state", "offload", "two-reasons", "port-0-joined"],
)
def test_options_of_the_wrong_server_are_refused_before_ray(
    tmp_path, capsys, monkeypatch, without_ray, argv, said
):
    """Ray's options without --ray, and one machine's server's options with it, are refused by name (Ray
    cannot be imported here: the refusal comes before it)."""
    monkeypatch.chdir(tmp_path)
    assert refusal(["./tiny-sd", *argv], capsys) == f"modular: error: {said}\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--replicas", "0"], "argument --replicas: must be at least 1 (got 0)"),
        (
            ["--replicas", "2", "--autoscale", "1:3"],
            "argument --autoscale: not allowed with argument --replicas",
        ),
        (
            ["--autoscale", "3"],
            "argument --autoscale: must be MIN:MAX replicas, whole numbers with 1 <= MIN <= MAX, e.g. 1:4 "
            "(got '3')",
        ),
        (
            ["--autoscale", "4:2"],
            "argument --autoscale: must be MIN:MAX replicas, whole numbers with 1 <= MIN <= MAX, e.g. 1:4 "
            "(got '4:2')",
        ),
        (
            ["--autoscale", "0:2"],
            "argument --autoscale: must be MIN:MAX replicas, whole numbers with 1 <= MIN <= MAX, e.g. 1:4 "
            "(got '0:2')",
        ),
        (
            ["--gpus-per-replica", "1.5"],
            "argument --gpus-per-replica: must be a number from 0 to 1, or a whole number of GPUs (got '1.5')",
        ),
        (
            ["--gpus-per-replica", "-1"],
            "argument --gpus-per-replica: must be a number from 0 to 1, or a whole number of GPUs (got '-1')",
        ),
        (
            ["--cpus-per-replica", "0"],
            "argument --cpus-per-replica: must be a finite number more than 0 (got 0)",
        ),
        (["--imbalance", "-1"], "argument --imbalance: must be a finite number of at least 0 (got -1)"),
        (["--imbalance", "lots"], "argument --imbalance: must be a number (got 'lots')"),
        (
            ["--stats-period", "soon"],
            "argument --stats-period: must be a number (got 'soon')",
        ),
        (["--tries", "0"], "argument --tries: must be at least 1 (got 0)"),
    ],
    ids=[
        "replicas-0",
        "replicas-and-autoscale",
        "autoscale-one-number",
        "autoscale-min-over-max",
        "autoscale-min-0",
        "gpus-fraction-over-1",
        "gpus-negative",
        "cpus-0",
        "imbalance-negative",
        "imbalance-text",
        "stats-period-text",
        "tries-0",
    ],
)
def test_a_bad_ray_value_is_refused_by_the_parser(capsys, without_ray, argv, said):
    assert refusal(["./tiny-sd", "--ray", *argv], capsys) == f"modular serve: error: {said}\n"


def test_gpus_per_replica_takes_fractions_and_whole_numbers():
    """0, a fraction up to 1 (several replicas per GPU) and a whole number of GPUs are each one replica's."""
    from modular.cli.main import build_parser

    for text, value in (("0", 0.0), ("0.25", 0.25), ("1", 1.0), ("2", 2.0)):
        args = build_parser().parse_args(["serve", "repo", "--ray", "--gpus-per-replica", text])
        assert args.gpus_per_replica == value
    args = build_parser().parse_args(["serve", "repo", "--ray", "--autoscale", "1:4"])
    assert (args.autoscale, args.replicas) == ((1, 4), None)


def test_the_ray_defaults_said_in_the_help_are_the_commands_and_build_apps(capsys):
    """The Ray options left unset default to ``RAY_DEFAULTS``, which are ``build_app``'s, as the help says."""
    import inspect

    from modular.cli.main import build_parser
    from modular.cli.serve_ray import RAY_DEFAULTS

    args = build_parser().parse_args(["serve", "repo", "--ray"])
    assert all(getattr(args, key) is None for key in RAY_DEFAULTS)
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for option, key in (
        ("--replicas N worker replicas", "replicas"),
        ("--cpus-per-replica F CPUs each replica holds", "cpus_per_replica"),
        (
            "--imbalance J job times by which a replica's expected wait may exceed the shortest and the replica "
            "still be chosen for the models it holds",
            "imbalance",
        ),
        ("--stats-period S seconds between two reports of what a replica holds", "stats_period"),
        ("--tries N tries of one job on the replicas before it fails", "tries"),
    ):
        assert f"{option} (default {RAY_DEFAULTS[key]:g})" in help_text, option
    try:
        from modular.ray_serve.app import build_app
    except ImportError:  # without Ray: the help and the table are checked, build_app's signature is not
        return
    parameters = inspect.signature(build_app).parameters
    named = {"cpus_per_replica": "num_cpus"}
    for key, value in RAY_DEFAULTS.items():
        assert parameters[named.get(key, key)].default == value, key


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ([], "2 Ray Serve replicas, 1 GPU each"),
        (
            ["--replicas", "1", "--budget", "64MiB"],
            "1 Ray Serve replica, a simulated device of 64.00 MiB each",
        ),
        (["--replicas", "4", "--gpus-per-replica", "0.5"], "4 Ray Serve replicas, 0.5 GPU each"),
        (["--autoscale", "2:8", "--gpus-per-replica", "0"], "2 to 8 Ray Serve replicas (autoscaled), no GPU"),
    ],
    ids=["defaults", "budget", "half-gpu", "autoscale"],
)
def test_the_start_line_says_how_many_replicas_and_their_devices(argv, said):
    from modular.cli.main import build_parser
    from modular.cli.serve_ray import where_models_run

    assert where_models_run(build_parser().parse_args(["serve", "repo", "--ray", *argv])) == said


def test_with_ray_an_address_without_a_token_or_a_missing_repo_is_refused_before_ray_starts(
    tmp_path, capsys, monkeypatch
):
    pytest.importorskip("ray.serve", reason=RAY_REASON)
    import ray

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    assert refusal(["--ray", "./tiny-sd", "--host", "0.0.0.0"], capsys) == (
        "modular: error: ValueError: binding '0.0.0.0' lets other machines reach this server: give a token "
        "with --token or MODULAR_SERVE_TOKEN, or bind 127.0.0.1\n"
    )
    assert refusal(["--ray", "./no-such-folder"], capsys) == (
        "modular: error: FileNotFoundError: './no-such-folder' is not a folder on disk, nor a hub repo id "
        "like 'org/name'; check the path\n"
    )
    assert not ray.is_initialized() and list(tmp_path.iterdir()) == []


def test_with_ray_a_port_in_use_is_one_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray.serve", reason=RAY_REASON)
    import socket

    import ray

    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said = refusal(["--ray", "./tiny-sd", "--port", str(port)], capsys)
    assert said.startswith(
        f"modular: error: OSError: cannot listen on 127.0.0.1:{port} (Address already in use)"
    )
    assert not ray.is_initialized()


# One replica: the command does the same for any count, and each replica is a process to start. The wording for
# other counts is tested above; jobs routed over two replicas of build_app, in test_ingress_cluster.py.
@pytest.mark.slow  # a local Ray cluster, a replica and the proxy started in a subprocess: half a minute
def test_serve_ray_runs_a_job_over_http_and_stops_on_sigint(serving_repos, direct, start_serve):
    """``modular serve --ray`` says where it listens and how many replicas serve, runs a job sent over HTTP
    with its token (the image equals the direct call's), refuses a request without it, and on SIGINT shuts
    Ray down, says unfinished jobs are lost and exits 0."""
    pytest.importorskip("ray.serve", reason=RAY_REASON)
    serving = start_serve(
        "--ray",
        f"sd={serving_repos['sd']}",
        "--port",
        "0",
        "--token",
        TOKEN,
        "--budget",
        "64MB",
        "--replicas",
        "1",
        "--cpus-per-replica",
        "0.5",
        "--preview-every",
        "0",
    )
    url = serving.url()
    assert serving.said == [
        f"modular serve: listening on {url} (sd; models on 1 Ray Serve replica, a simulated device of 61.04 MiB "
        f"each); the page: {url}/?token=<your token>"
    ]
    request = {"workflow": "sd", "prompt": "a red fox", "steps": 2, "size": "32x32", "seed": 7}
    with httpx.Client(base_url=url, timeout=60) as client:
        assert client.post("/v1/jobs", json=request).status_code == 401
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        job_id = client.post("/v1/jobs", json=request).json()["id"]
        job = wait_for_state(client, job_id)
        assert job["state"] == "done", job
        image = client.get(f"/v1/jobs/{job_id}/result", params={"index": 0})
    assert image.headers["content-type"] == "image/png" and image.content == direct(request)[0]
    status, rest, errors = serving.stop(signal.SIGINT)
    assert status == 0, errors
    assert rest == [
        "modular serve: stopped; Ray Serve and the local Ray cluster shut down; unfinished jobs are lost (the "
        "ingress kept them in memory)"
    ]
