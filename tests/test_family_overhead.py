"""benchmarks/family_overhead.py: a row per family with ours/classic (and ours/peer), and a failing exit when
ours stops equalling classic."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

ROOT = str(Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, ROOT)
    try:
        yield importlib.import_module("benchmarks.family_overhead")
    finally:
        sys.path.remove(ROOT)


def _run(bench, monkeypatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["family_overhead.py", "--repeats", "1", "--warmup", "0", *args])
    threads = torch.get_num_threads()
    try:
        return bench.main()
    finally:
        torch.set_num_threads(threads)  # the benchmark runs on one thread; the worker's next tests do not


def test_prints_ours_classic_and_peer_for_a_family(bench, monkeypatch, capsys):
    """Z-Image (which the peer has): timings of all three, ours equal to classic, the peer's difference."""
    assert _run(bench, monkeypatch, "--families", "z-image") == 0
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.startswith("z-image")
    for part in ("ours/classic", "equal: True", "ours/peer", "max |ours-peer|"):
        assert part in row


def test_a_family_without_a_peer_pipeline_says_so(bench, monkeypatch, capsys):
    assert _run(bench, monkeypatch, "--families", "stable-diffusion") == 0
    assert "peer: none for this family" in capsys.readouterr().out


def test_exits_1_when_ours_differs_from_classic(bench, monkeypatch, capsys):
    """A changed output of ours (one pixel) is reported as not equal and fails the run."""
    runners = bench.runners

    def ours_changed(*args, **kwargs):
        pair, inputs = runners(*args, **kwargs)
        ours = dict(pair)["ours"]

        def changed():
            images = ours().clone()
            images.view(-1)[0] += 1.0
            return images

        return [("ours", changed), *pair[1:]], inputs

    monkeypatch.setattr(bench, "runners", ours_changed)
    assert _run(bench, monkeypatch, "--families", "z-image") == 1
    assert "equal: False" in capsys.readouterr().out


def test_unknown_family_is_named(bench, monkeypatch, capsys):
    assert _run(bench, monkeypatch, "--families", "no-such-family") == 2
    err = capsys.readouterr().err
    assert "no-such-family" in err and "z-image" in err


def test_overhead_run_families_runs_this_benchmark_with_its_options(monkeypatch):
    """``benchmarks/overhead.py --run families`` hands its rounds and steps to family_overhead.main."""
    benchmarks = str(Path(ROOT) / "benchmarks")
    monkeypatch.syspath_prepend(benchmarks)
    overhead = importlib.import_module("overhead")
    family_overhead = importlib.import_module("family_overhead")
    seen: list[list[str]] = []
    monkeypatch.setattr(family_overhead, "main", lambda: seen.append(list(sys.argv[1:])) or 0)
    monkeypatch.setattr(sys, "argv", ["overhead.py", "--run", "families", "--repeats", "3", "--steps", "1"])
    with pytest.raises(SystemExit) as stopped:
        overhead.main()
    assert stopped.value.code == 0
    assert seen == [["--repeats", "3", "--warmup", "5", "--steps", "1"]]
