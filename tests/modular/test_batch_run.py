"""Batch runs: the same images on 2 ranks as in one process, resumed after a kill, written atomically."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from components import ComponentsManager
from modular.batch import BatchOptions, OutputStore, RankInfo, load_job, run_batch
from modular.batch.runner import enable_offload
from modular.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = 6


def _job_file(folder: Path, repo: Path, output: str = "out") -> Path:
    """A 6-entry job (3 prompts, 2 images each, 2 steps, 32x32) saving exact float arrays (.npy)."""
    folder.mkdir(parents=True, exist_ok=True)
    job = {
        "output": output,
        "seed": 5,
        "steps": 2,
        "sizes": ["32x32"],
        "format": "npy",
        "prompts": ["a cat", "a dog", "a bird"],
        "images_per_prompt": 2,
        "workflows": [{"name": "sd", "repo": str(repo), "workflow": "text2image"}],
    }
    path = folder / "job.json"
    path.write_text(json.dumps(job))
    return path


@pytest.fixture(scope="module")
def reference(repo, tmp_path_factory):
    """The job run uninterrupted in this process: its output folder."""
    path = _job_file(tmp_path_factory.mktemp("reference"), repo)
    result = run_batch(load_job(path), BatchOptions(progress=False), info=RankInfo())
    assert result.ran == tuple(range(ENTRIES))
    return path.parent / "out"


def _arrays(folder: Path) -> dict[str, torch.Tensor]:
    return {path.name: torch.from_numpy(np.load(path)) for path in sorted(folder.glob("*.npy"))}


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _sidecars(folder: Path) -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted(folder.glob("*.npy.json"))}


def test_two_ranks_make_the_same_images_as_one_process(repo, reference, tmp_path):
    """Under torch.distributed.run with 2 gloo ranks, every image is torch.equal to the one-process run's,
    each rank runs half, and rank 0's manifest lists every entry once."""
    path = _job_file(tmp_path, repo)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
    command += ["-m", "modular", "batch", str(path), "--threads", "1", "--quiet"]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    ours, theirs = _arrays(tmp_path / "out"), _arrays(reference)
    assert sorted(ours) == sorted(theirs) and len(ours) == ENTRIES
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [row["index"] for row in manifest["entries"]] == list(range(ENTRIES))
    assert [row["rank"] for row in manifest["entries"]] == [0, 1, 0, 1, 0, 1]
    assert {row["status"] for row in manifest["entries"]} == {"ran"} and manifest["world_size"] == 2
    logs = sorted(path.name for path in (tmp_path / "out" / "logs").iterdir())
    assert logs == ["rank-0.log", "rank-1.log"]


def test_a_killed_job_resumes_without_running_any_entry_twice(repo, reference, tmp_path):
    """SIGKILL after 2 outputs, then the same command again: the finished entries are kept as they were, the
    rest run once, no partial file is left, and every image equals the uninterrupted run's."""
    path = _job_file(tmp_path, repo)
    out = tmp_path / "out"
    with open(tmp_path / "first.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "modular", "batch", str(path), "--threads", "1", "--quiet"],
            env=_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while len(_sidecars(out) if out.is_dir() else {}) < 2 and process.poll() is None:
            assert time.monotonic() < deadline, "no outputs within 120 s"
            time.sleep(0.01)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text()
    kept = _sidecars(out)
    assert 2 <= len(kept) < ENTRIES
    unrecorded = {path.name for path in out.glob("*.npy")} - {name.removesuffix(".json") for name in kept}
    assert len(unrecorded) <= 1  # at most the image in flight, written but not yet recorded
    # A kill during a write leaves at most a temporary file; plant one to stand for it.
    (out / ".sd-p00002-32x32-1.npy.0-99999.partial").write_bytes(b"half an image")
    assert main(["batch", str(path), "--threads", "1", "--quiet"]) == 0
    assert not list(out.glob("*.partial")) and not list(out.glob(".*"))
    after = _sidecars(out)
    assert {name: after[name] for name in kept} == kept  # the finished entries did not run again
    (second,) = {sidecar["run"] for name, sidecar in after.items() if name not in kept}
    assert second not in {sidecar["run"] for sidecar in kept.values()}
    log = (out / "logs" / "rank-0.log").read_text().splitlines()
    ran_now = [int(line.split(": ran ")[1].split()[0]) for line in log if f"run {second}: ran " in line]
    assert sorted(ran_now) == sorted(after[name]["entry"]["index"] for name in after if name not in kept)
    ours, theirs = _arrays(out), _arrays(reference)
    assert sorted(ours) == sorted(theirs) and all(torch.equal(ours[name], theirs[name]) for name in ours)
    manifest = json.loads((out / "manifest.json").read_text())
    statuses = [row["status"] for row in manifest["entries"]]
    assert statuses.count("earlier") == len(kept) and statuses.count("ran") == ENTRIES - len(kept)


def test_a_changed_entry_runs_again_and_a_finished_one_does_not(repo, reference, tmp_path, capsys):
    """An output whose sidecar describes another entry (here: other steps) is made again; the finished one is
    skipped, and the job's bar starts at it and ends at every entry."""
    path = _job_file(tmp_path, repo)
    job = load_job(path)
    store = OutputStore(job.output, "npy")
    job.output.mkdir()
    for name in ("sd-p00000-32x32-0.npy", "sd-p00000-32x32-1.npy"):
        (job.output / name).write_bytes((reference / name).read_bytes())
        (job.output / f"{name}.json").write_text((reference / f"{name}.json").read_text())
    changed = json.loads((job.output / "sd-p00000-32x32-1.npy.json").read_text())
    changed["entry"]["steps"] = 3
    (job.output / "sd-p00000-32x32-1.npy.json").write_text(json.dumps(changed))
    assert sorted(store.scan(job.entries)) == [0]
    result = run_batch(job, BatchOptions(progress=True), info=RankInfo())
    assert result.ran == (1, 2, 3, 4, 5) and result.earlier == 1
    bar = capsys.readouterr().err
    assert "batch:  17%" in bar and "1/6" in bar and "batch: 100%" in bar and "6/6" in bar
    assert store.finished(job.entries[1])["entry"]["steps"] == 2


def test_auto_offload_on_a_simulated_device_gives_the_same_images(repo, reference, tmp_path):
    """With auto offload onto a simulated device per rank, the images equal the run without offload."""
    path = _job_file(tmp_path, repo)
    options = BatchOptions(offload="sim", budget=64 * 1024**2, progress=False)
    result = run_batch(load_job(path), options, info=RankInfo())
    assert result.total_ran == ENTRIES
    ours, theirs = _arrays(tmp_path / "out"), _arrays(reference)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)
    assert _sidecars(tmp_path / "out")["sd-p00000-32x32-0.npy.json"]["device"] == (
        "a simulated device under auto offload"
    )


def test_a_damaged_output_is_made_again_at_resume_and_named(repo, reference, tmp_path):
    """An output whose bytes no longer match its sidecar's sha256 (same size) runs again; the run names it."""
    path = _job_file(tmp_path, repo)
    job = load_job(path)
    job.output.mkdir()
    for name in ("sd-p00000-32x32-0.npy", "sd-p00000-32x32-1.npy"):
        (job.output / name).write_bytes((reference / name).read_bytes())
        (job.output / f"{name}.json").write_text((reference / f"{name}.json").read_text())
    damaged = bytearray((job.output / "sd-p00000-32x32-1.npy").read_bytes())
    damaged[-1] ^= 0xFF  # one flipped byte: same size, other content
    (job.output / "sd-p00000-32x32-1.npy").write_bytes(bytes(damaged))
    said = []
    result = run_batch(job, BatchOptions(progress=False), info=RankInfo(), report=said.append)
    assert result.ran == (1, 2, 3, 4, 5) and result.earlier == 1
    assert said[0] == (
        "entry 1 sd-p00000-32x32-1: its output sd-p00000-32x32-1.npy does not match the size and sha256 its "
        "sidecar recorded (damaged); it runs again"
    )
    assert _arrays(job.output).keys() == _arrays(reference).keys()
    assert all(torch.equal(a, b) for a, b in zip(_arrays(job.output).values(), _arrays(reference).values()))


def test_a_served_simulated_device_takes_a_bandwidth_and_nothing_else_does():
    manager = ComponentsManager()
    enable_offload(manager, "sim", torch.device("cpu"), 10**6, bandwidth="1MB/s")
    (engine,) = manager.offload_engines
    assert engine._placer._probe.real_time and engine._placer._probe.h2d_bandwidth == 10**6
    for offload in ("none", "auto"):
        with pytest.raises(ValueError, match="a bandwidth is for a simulated device"):
            enable_offload(ComponentsManager(), offload, torch.device("cpu"), bandwidth="1MB/s")
