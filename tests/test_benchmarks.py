"""benchmarks/gpu_offload.py on the CPU: the GPU run's code with our rows on a SimulatedDevice."""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
from functools import partial
from pathlib import Path

import pytest
import torch

from offload.partial.groups import BASE, split_groups

BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")
OURS = [
    "ours (NextUse)",
    "ours + prefetch",
    "ours + prefetch, victims whole",
    "ours streaming",
    "ours streaming + prefetch",
]
PEERS_ON_CPU = ["enable_model_cpu_offload (approx.)", "diffusers group offload (cpu: no stream)"]


@pytest.fixture(scope="module")
def modules():
    """The benchmark script and its methods, imported as the script imports them (from benchmarks/)."""
    sys.path.insert(0, BENCHMARKS)
    try:
        yield importlib.import_module("gpu_offload"), importlib.import_module("gpu_methods")
    finally:
        sys.path.remove(BENCHMARKS)


@pytest.fixture(scope="module")
def smoke(modules):
    """One ``--device cpu --smoke`` run: its exit status, its output and the results behind the table."""
    script, _ = modules
    captured = {}
    run_rows = script.run_rows

    def spy(*args):
        captured["results"], captured["notes"], failed = run_rows(*args)
        return captured["results"], captured["notes"], failed

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setattr(script, "run_rows", spy)
        status = script.main(["--device", "cpu", "--smoke"])
    return status, out.getvalue(), {r.method: r for r in captured["results"]}


def test_the_smoke_run_prints_the_table_and_exits_zero(smoke):
    """Every row that runs on the CPU is a table line; the CUDA-only peer is skipped with its reason."""
    status, out, results = smoke
    assert status == 0
    table = out[out.index("method ") :].splitlines()
    assert table[0].split() == "method cap KiB wall s x ours peak KiB h2d KiB d2h KiB equal".split()
    assert [line[:40].strip() for line in table[1 : 1 + len(OURS + PEERS_ON_CPU)]] == OURS + PEERS_ON_CPU
    assert "diffusers ComponentsManager: skipped (needs CUDA: its AutoOffloadStrategy reads" in out


def test_every_row_run_on_the_cpu_equals_no_offload(smoke):
    """Our rows and the peer rows that run on the CPU give outputs torch.equal to the reference."""
    _, out, results = smoke
    assert sorted(results) == sorted(OURS + PEERS_ON_CPU)
    assert all(result.equal for result in results.values())
    assert all(line.endswith(" yes") for line in out.splitlines() if line[:40].strip() in results)


def test_our_rows_do_what_their_labels_say(smoke):
    """The caps make offload matter, streaming rows stream, prefetch rows prefetch, nothing is copied back."""
    _, _, results = smoke
    transformer = 12 * 64 * 64 * 2  # the smoke run's transformer: twelve 64x64 bf16 layers
    for label in OURS:
        result = results[label]
        assert result.d2h == 0 and result.peak <= result.cap
        assert any(reason.startswith("evict") for reason in result.reasons)
        assert ("prefetch" in result.reasons) == ("prefetch" in label)
        streaming = "streaming" in label
        assert (result.cap < transformer) == streaming
        if streaming:
            assert result.reasons["stream"] > 0 and result.reasons["stream tail"] > 0


def test_a_wrong_output_is_shown_and_fails_the_run(modules, monkeypatch):
    """A reference that differs in one element makes every row NO and the exit status 1."""
    script, _ = modules
    reference = script.reference

    def off_by_one(*args):
        out = reference(*args)
        out.view(-1)[0] += 1
        return out

    monkeypatch.setattr(script, "reference", off_by_one)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = script.main(["--device", "cpu", "--smoke"])
    assert status == 1
    rows = [line for line in out.getvalue().splitlines() if line[:40].strip() in OURS + PEERS_ON_CPU]
    assert len(rows) == len(OURS + PEERS_ON_CPU) and all(line.endswith(" NO") for line in rows)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--stream-budget-gb", "9"],
            "--stream-budget-gb (9.00) less --margin-gb (0.50) must be below one transformer (2.77 GiB), or "
            "nothing streams. Lower --stream-budget-gb.",
        ),
        (
            ["--budget-gb", "2"],
            "--budget-gb (2.00) less --margin-gb (0.50) must hold the largest model (2.77 GiB), or the peer's "
            "whole-model offloads cannot run. Raise --budget-gb.",
        ),
    ],
)
def test_caps_that_cannot_show_the_rows_are_refused_before_anything_is_built(
    modules, monkeypatch, argv, message
):
    """Exit status 2 with the cap at fault and the fix; no model is built."""
    script, _ = modules
    monkeypatch.setattr(script, "build", lambda *args: pytest.fail("built models"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = script.main(["--device", "cpu", *argv])
    assert status == 2
    assert out.getvalue().strip() == message


def test_both_splitters_see_each_block_of_a_chain(modules):
    """Ours and diffusers' block level split a Chain into proj_in plus one group per block."""
    from diffusers.hooks import apply_group_offloading

    _, methods = modules
    chain = methods.Chain(4 * 16 * 16 * 2, 16, torch.device("cpu"))
    assert [group.name for group in split_groups(chain)] == [BASE, "blocks.0", "blocks.1", "blocks.2"]
    apply_group_offloading(chain, torch.device("cpu"), offload_type="block_level", num_blocks_per_group=1)
    for block in chain.blocks:
        assert block._diffusers_hook.get_hook("group_offloading").group.modules == [block]
    assert chain._diffusers_hook.get_hook("group_offloading").group.modules == [chain.proj_in]


def test_a_bare_sequential_gives_diffusers_no_blocks():
    """Why Chain keeps its blocks in a ModuleList child: block level moves a Sequential of layers as one group."""
    from diffusers.hooks import apply_group_offloading

    sequential = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    apply_group_offloading(
        sequential, torch.device("cpu"), offload_type="block_level", num_blocks_per_group=1
    )
    assert not any(hasattr(layer, "_diffusers_hook") for layer in sequential)
    assert sequential._diffusers_hook.get_hook("group_offloading").group.modules == list(sequential)


def test_a_chain_counts_the_bytes_to_moves(modules):
    """Moving a Chain off the host with .to() counts its bytes host-to-device; .to() where it is counts none."""
    _, methods = modules
    chain = methods.Chain(2 * 8 * 8 * 2, 8, torch.device("cpu"))
    chain.to("cpu")
    assert (chain.h2d_bytes, chain.d2h_bytes) == (0, 0)
    chain.to("meta")
    assert (chain.h2d_bytes, chain.d2h_bytes) == (2 * 8 * 8 * 2, 0)


def test_the_manager_row_runs_the_peer_manager_with_equal_outputs(modules, monkeypatch):
    """The ComponentsManager row (CUDA only in the script) runs on the CPU once its free-memory query is answered."""
    from diffusers.utils.torch_utils import TorchDeviceBackend

    _, methods = modules
    monkeypatch.setattr(TorchDeviceBackend, "mem_get_info", lambda self: (10**6, 10**6))
    monkeypatch.setattr(methods.Target, "peer_margin", lambda self: 0)
    pristine = methods.build(
        {"clip": 2048, "t5": 2048, "transformer": 4096, "canny": 4096, "depth": 4096, "vae": 2048},
        16,
        torch.device("cpu"),
    )
    order = ["text2img", "canny", "depth"]
    inputs = methods.workflow_inputs(order, 2, 16)
    references = {w: methods.reference(pristine, w, x, 2, torch.device("cpu")) for w, x in inputs.items()}
    bench = methods.Bench(methods.Target(False, 0), inputs, references, order, 2)
    result = methods.run_method(bench, pristine, 10**6, partial(methods.peer_manager, label="manager"))
    assert result.equal and result.method == "manager"


def test_the_workflows_run_without_autograd(modules):
    """Weights require grad, as loaded models' do; a workflow's output has no graph that would hold every
    activation on the device."""
    _, methods = modules
    models = methods.build({name: 2048 for name in methods.SIZES_GB}, 16, torch.device("cpu"))
    assert all(p.requires_grad for p in models["t5"].parameters())
    x = methods.workflow_inputs(["canny"], 2, 16)["canny"]
    for run in (methods.run_workflow, methods.reference):
        out = run(models, "canny", x, 2, torch.device("cpu"))
        assert out.grad_fn is None and not out.requires_grad


def test_a_row_that_raises_is_reported_and_the_others_still_run(modules, monkeypatch):
    """The failing row is named with its error, every other row is in the table, the exit status is 1."""
    script, _ = modules

    def broken(bench, models, label):
        msg = "no such hook"
        raise RuntimeError(msg)

    monkeypatch.setattr(script, "peer_model_offload", broken)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = script.main(["--device", "cpu", "--smoke"])
    assert status == 1
    lines = out.getvalue().splitlines()
    assert "enable_model_cpu_offload (approx.): FAILED (RuntimeError: no such hook)" in lines
    ran = [line[:40].strip() for line in lines if line.endswith(" yes")]
    assert ran == OURS + ["diffusers group offload (cpu: no stream)"]


def test_the_startup_smoke_run_prints_its_table():
    """benchmarks/startup.py with one round of two commands: a row per command, ratios to the peer's import."""
    sys.path.insert(0, BENCHMARKS)
    try:
        startup = importlib.import_module("startup")
    finally:
        sys.path.remove(BENCHMARKS)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = startup.main(["--rounds", "1", "--only", "modular --help"])
    assert status == 0
    lines = out.getvalue().splitlines()
    assert lines[1].split() == ["command", "median", "s", "x", "peer", "target"]
    assert [line[:46].strip() for line in lines[2:]] == [
        "modular --help",
        "import diffusers.modular_pipelines",
    ]
    assert lines[3].split()[-1] == "1.00x"  # the peer's import, its own unit
    assert "<= 0.1x" in lines[2]


def test_the_manager_scale_quick_run_prints_every_row_at_each_size_beside_the_peer():
    """``manager_scale.py --quick``: each operation at 20 and 200 models, the peer's time where it has the
    operation, and the ratio to the smallest size; its hooked calls computed what unhooked ones do."""
    sys.path.insert(0, BENCHMARKS)
    try:
        script = importlib.import_module("manager_scale")
    finally:
        sys.path.remove(BENCHMARKS)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = script.main(["--quick"])
    assert status == 0
    lines = out.getvalue().splitlines()
    header = lines.index(next(line for line in lines if line.startswith("operation")))
    assert lines[header].split() == "operation models ours peer ours/peer vs 20".split()
    rows = lines[header + 1 : header + 1 + 2 * len(script.OPERATIONS)]
    for row, (size, operation) in zip(
        rows, [(s, op) for s in (20, 200) for op in script.OPERATIONS], strict=True
    ):
        name = operation + (" (all)" if operation in script.WHOLE else "")
        assert row.startswith(name) and row[32:].split()[0] == str(size)
        assert row.endswith("x")
        assert ("hooked call" in operation) == (row.split()[-3:-1] == ["-", "-"])
    assert lines[header + 1 + 2 * len(script.OPERATIONS)].startswith("unhooked call: ")


@pytest.fixture(scope="module")
def serving():
    """benchmarks/serving.py, imported as the script runs (from benchmarks/)."""
    sys.path.insert(0, BENCHMARKS)
    try:
        yield importlib.import_module("serving")
    finally:
        sys.path.remove(BENCHMARKS)


@pytest.mark.slow
def test_the_serving_quick_run_prints_a_table_and_the_targets_at_each_load(serving, monkeypatch):
    """``serving.py --quick``: per load, a row per order and the three targets; every job of the stream ran
    once in each order, and the bytes printed are the bytes the jobs moved (prefetch off: nothing else moves)."""
    runs = []
    run_order = serving.run_order

    def spy(bench, order, stream, max_wait):
        result = run_order(bench, order, stream, max_wait)
        runs.append((stream, result))
        return result

    monkeypatch.setattr(serving, "run_order", spy)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = serving.main(["--quick"])
    assert status == 0
    lines = out.getvalue().splitlines()
    headers = [number for number, line in enumerate(lines) if line.startswith("order ")]
    assert len(headers) == 2 == len(runs) // len(serving.ORDERS)
    for header, load in zip(headers, ("1x", "0.5x"), strict=True):
        assert lines[header - 1].startswith(f"[load: mean inter-arrival {load} the mean service")
        columns = "order MiB to dev x FIFO switches makespan p50 s p95 s x FIFO max s max wait due"
        assert lines[header].split() == columns.split()
        rows = lines[header + 1 : header + 1 + len(serving.ORDERS)]
        assert [row[:22].strip() for row in rows] == [order.label for order in serving.ORDERS]
        assert rows[0].split()[-9] == "1.00x"  # FIFO's bytes, its own unit
        targets = lines[header + 1 + len(serving.ORDERS) : header + 4 + len(serving.ORDERS)]
        assert [t.split()[:2] for t in targets] == [
            ["affinity", "moves"],
            ["affinity", "p95"],
            ["affinity", "max"],
        ]
        # Printed, not asserted met: 8 jobs are too short a stream for a queue to form; no time is asserted.
        assert all(t.endswith((": met", ": NOT met")) for t in targets)
    for stream, result in runs:
        assert sorted(job.arrived for job in result.jobs) == [arrival.at for arrival in stream]
        assert result.bytes_to_device == sum(job.bytes_to_device for job in result.jobs) > 0


@pytest.mark.slow
def test_serving_affinity_moves_at_least_35_percent_fewer_bytes_when_a_queue_holds_both_families(
    serving, tmp_path
):
    """Six jobs queued at once, the families alternating: arrival order swaps the family five times, affinity
    once. Bytes are exact and the same every run (a simulated device, prefetch off, virtual time), so the
    benchmark's bytes target is asserted here; times are virtual too, so a second run gives the same figures."""
    import torch

    torch.set_num_threads(1)
    bench = serving.Bench(serving.make_repos(tmp_path), serving.parse_args(["--quick"]))
    names = ["sd", "sdxl", "sd-img2img", "sdxl", "sd", "sdxl"]
    stream = [serving.Arrival(0.0, name, seed) for seed, name in enumerate(names)]
    fifo, affinity = (serving.run_order(bench, order, stream, 1e6) for order in serving.ORDERS[:2])
    assert [job.workflow for job in fifo.jobs] == names
    assert [job.workflow for job in affinity.jobs] == ["sd", "sd-img2img", "sd", "sdxl", "sdxl", "sdxl"]
    assert (fifo.switches, affinity.switches) == (5, 1)
    assert affinity.bytes_to_device <= serving.BYTES_TARGET * fifo.bytes_to_device
    assert serving.run_order(bench, serving.ORDERS[0], stream, 1e6) == fifo


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--move", "-1"], "--move must be a number of job times of at least 0"),
        (["--move", "inf"], "--move must be a number of job times of at least 0"),
        (["--repeats", "0"], "--repeats must be at least 1"),
    ],
)
def test_bad_ray_benchmark_settings_are_refused_naming_the_option(serving, argv, message, capsys):
    with pytest.raises(SystemExit):
        serving.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.ray  # starts a local Ray cluster: shares the Ray tests' worker
def test_the_serving_ray_quick_run_prints_both_routers_and_each_replicas_repos(serving, monkeypatch):
    """``serving.py --ray --quick``: two replicas on a local Ray cluster, 8 jobs through each router. The
    table has a row per router and the targets; the replicas' table a row per replica of each, the repos
    routed to it and the repos it loaded (the same: a replica loads a repo for a job of it, and nothing
    unloads). Bytes are the replicas' own counts, each at least the families it loaded; no time is asserted."""
    pytest.importorskip("ray.serve", reason='needs Ray Serve: pip install "modular-pipelines[ray]"')
    serving_ray = importlib.import_module("serving_ray")
    runs, benches = [], []
    run_router, bench = serving_ray.run_router, serving.Bench

    def spy(router, stream, deployment):
        result = run_router(router, stream, deployment)
        runs.append((stream, result, deployment.bandwidth))
        return result

    def made(*args):
        benches.append(bench(*args))
        return benches[-1]

    monkeypatch.setattr(serving_ray, "run_router", spy)
    monkeypatch.setattr(serving, "Bench", made)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = serving.main(["--ray", "--quick"])
    assert status == 0
    lines = out.getvalue().splitlines()
    (header,) = [
        number for number, line in enumerate(lines) if line.startswith("router ") and "x default" in line
    ]
    assert lines[header - 1].startswith("[load: mean inter-arrival 1x the mean service")
    warmup = serving_ray.WARMUP
    assert f"latencies: every job but each run's first {warmup} " in out.getvalue()
    for _, result, _ in runs:  # the first to arrive are left out of the latencies
        assert result.timed == sorted(result.jobs, key=lambda job: job.submitted)[warmup:]
    (bandwidth,) = {bandwidth for _, _, bandwidth in runs}  # moves take time: one bandwidth for both routers
    (moves,) = [line for line in lines if line.startswith("simulated devices' host-to-device bandwidth")]
    assert moves.endswith(
        f"{bandwidth / 2**20:.1f} MiB/s: the largest family's move takes 0.5 mean warm job times"
    )
    columns = "router MiB to dev x default p50 s p95 s x default max s makespan mean ran"
    assert lines[header].split() == columns.split()
    labels = [router.label for router in serving_ray.ROUTERS]
    rows = lines[header + 1 : header + 3]
    assert [row[:22].strip() for row in rows] == labels
    assert rows[0].split()[-7] == "1.00x"  # the default's bytes, its own unit
    targets = lines[header + 3 : header + 7]
    assert [t.split()[:2] for t in targets[:2]] == [["residency", "moves"], ["residency", "p95"]]
    assert all(t.endswith((": met", ": NOT met")) for t in targets)
    assert targets[2:] == [
        f"  {label}: each replica loads at most the repos routed to it: met" for label in labels
    ]
    (replicas,) = [
        number for number, line in enumerate(lines) if line.startswith("router ") and "loaded repos" in line
    ]
    printed = lines[replicas + 1 : replicas + 5]
    assert [row[:22].strip() for row in printed] == [labels[0]] * 2 + [labels[1]] * 2
    assert len(runs) == 2 and len(benches) == 1
    sizes = benches[0].sizes
    families = {served.repo for served in serving.WORKFLOWS}
    for (stream, result, _), line in zip(runs, (printed[:2], printed[2:])):
        assert sorted(job.workflow for job in result.jobs) == sorted(arrival.workflow for arrival in stream)
        assert len(result.replicas) == 2 and sum(len(result.routed(r.replica)) for r in result.replicas) == 8
        assert result.bytes_to_device == sum(r.bytes_to_device for r in result.replicas) > 0
        for replica, text in zip(result.replicas, line):
            assert replica.loaded == result.routed_repos(replica.replica) <= families
            assert replica.bytes_to_device >= sum(sizes[repo] for repo in replica.loaded)
            assert text.split()[-1] == (",".join(sorted(replica.loaded)) or "-")
        assert all(job.submitted <= job.started <= job.done for job in result.jobs)
