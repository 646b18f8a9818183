"""A server process for tests/serving/test_durability.py to kill: a Scheduler on a state folder, fed requests,
saying on stdout what it has done, and stopping dead at a chosen moment so that the test's ``SIGKILL`` lands
exactly there.

Run as ``python serve_child.py REPO``: it imports everything and loads the repo's pipeline once (so that each
server starts in a fraction of a second), prints ``ready``, then for each config file named on a line of its
stdin forks a server process, which prints ``pid <its pid>`` first; when that process ends (killed, or done)
it prints ``ended <pid> signal <number>`` or ``ended <pid> exit <status>``. The forked process is the server the test kills: a process of its own,
with its own manager, scheduler and SQLite connection, made after the fork. A config holds ``repo`` (a tiny Stable Diffusion repo, served as
``sd``), ``state`` (the folder), ``requests`` (submitted in order, the queue paused, each id printed as
``accepted <id>`` as soon as ``submit`` returns; then the queue resumes) and ``hold`` (where to stop, or
``null`` to run everything and exit): ``{"at": "accepted" | "step" | "written" | "partial", "job": k,
"image": i}``. ``accepted`` stops after the k-th accept (the queue never resumes); ``step`` inside the first
step of job k's image i (the job is running); ``written`` right after image i's result file is renamed into
place, before the store records it; ``partial`` halfway through writing that file. At each hold the child
prints ``hold <what>`` and sleeps until it is killed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"

import torch  # noqa: E402
import tqdm  # noqa: E402

torch.set_num_threads(1)
tqdm.tqdm.monitor_interval = 0  # no monitor thread: the process forks servers

import modular.serving.scheduler as scheduler_module  # noqa: E402
from components import ComponentsManager  # noqa: E402
from modular.serving import EventHub, Scheduler, ServedWorkflow, ServedWorkflows  # noqa: E402
from modular.serving.store import write_result  # noqa: E402


def say(line: str) -> None:
    print(line, flush=True)


def hold(what: str) -> None:
    say(f"hold {what}")
    time.sleep(600)  # the test kills the process long before
    raise SystemExit(f"not killed at {what}")


class HoldingHub(EventHub):
    """Events as the scheduler publishes them, printed; a hold at the chosen job's step."""

    def __init__(self, ids: list[str], spec: dict[str, Any] | None) -> None:
        super().__init__()
        self.ids = ids
        self.spec = spec

    def publish(self, kind: str, job_id: str | None = None, **fields: Any) -> dict[str, Any]:
        event = super().publish(kind, job_id, **fields)
        if kind in ("started", "done", "failed", "cancelled"):
            say(f"{kind} {job_id}")
        spec = self.spec
        if (
            spec is not None
            and spec["at"] == "step"
            and kind == "step"
            and self.ids.index(job_id) == spec["job"]
            and fields["image"] == spec.get("image", 0)
        ):
            hold(f"step {job_id} {fields['image']}")
        return event


def holding_writer(ids: list[str], spec: dict[str, Any]):
    """``write_result`` that holds after (``written``) or halfway through (``partial``) the chosen file."""

    def write(folder, name, data):
        job_id, _, index = name.rpartition(".")[0].rpartition("-")
        chosen = ids.index(job_id) == spec["job"] and int(index) == spec.get("image", 0)
        if chosen and spec["at"] == "partial":
            folder.mkdir(parents=True, exist_ok=True)
            partial = folder / f".{name}.{os.getpid()}-1.partial"
            with open(partial, "wb") as file:
                file.write(data[: len(data) // 2])
                file.flush()
            hold(f"partial {name}")
        path = write_result(folder, name, data)
        if chosen:
            hold(f"written {name}")
        return path

    return write


def serve(config_path: str) -> None:
    """One server on the config's state folder (see the module docstring)."""
    say(f"pid {os.getpid()}")
    with open(config_path) as file:
        config = json.load(file)
    spec = config.get("hold")
    ids: list[str] = []
    manager = ComponentsManager()
    served = ServedWorkflows([ServedWorkflow("sd", config["repo"])], manager)
    if spec is not None and spec["at"] in ("written", "partial"):
        scheduler_module.write_result = holding_writer(ids, spec)
    scheduler = Scheduler(served, config["state"], prefetch=False, events=HoldingHub(ids, spec))
    scheduler.pause()
    scheduler.start()
    for number, data in enumerate(config["requests"]):
        job = scheduler.submit(data)
        ids.append(job.id)
        say(f"accepted {job.id}")
        if spec is not None and spec["at"] == "accepted" and number == spec["job"]:
            hold(f"accepted {job.id}")
    scheduler.resume()
    if not scheduler.wait_idle(timeout=120):
        raise SystemExit("the queue did not drain")
    scheduler.close()
    say("idle")


def warm(repo: str) -> None:
    """Import and load what a server uses, in this process, leaving no thread behind (a fork copies only the
    thread that forks)."""
    served = ServedWorkflows([ServedWorkflow("sd", repo)], ComponentsManager())
    served.load("sd")
    if threading.active_count() != 1:
        raise SystemExit(f"threads left before forking: {threading.enumerate()}")


def fork_servers(repo: str) -> None:
    warm(repo)
    say("ready")
    for line in sys.stdin:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                serve(line.strip())
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        ended = os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        say(f"ended {pid} {'signal ' if os.WIFSIGNALED(status) else 'exit '}{ended}")


if __name__ == "__main__":
    fork_servers(sys.argv[1])
