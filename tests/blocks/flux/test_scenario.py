"""The seed's scenario in a quick mode: three Flux workflows on one manager under auto offload."""

import attrs
import numpy as np
import pytest
import torch

from blocks.flux import FAMILY, make_seed_scale_repo, seed_scenario
from blocks.flux.control_images import depth_like_map, edge_map
from modular import ComponentsManager
from modular.batch.jobs import JobRunner
from offload import NextUseStrategy, SimulatedDevice, SmallestSufficientSet, module_nbytes
from offload.engine.replay import UseRecorder, replay

MiB = 2**20
SHARED = ("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2", "vae", "scheduler")


def _quick(demo):
    """The scenario's jobs with one denoising step each."""
    return [attrs.evolve(job, inputs={**job.inputs, "num_inference_steps": 1}) for job in demo.jobs]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return seed_scenario(tmp_path_factory.mktemp("scenario"))


@pytest.fixture(scope="module")
def offloaded(demo):
    """The quick scenario under auto offload on the scenario's simulated device, uses recorded; each result's
    table (``str(manager)``) in a terminal wide enough for the table, one line per model."""
    cm = ComponentsManager()
    cm.enable_auto_cpu_offload(device=SimulatedDevice(demo.budget), memory_reserve_margin=demo.margin)
    with UseRecorder(cm.offload_engine) as recorder, pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "1000")
        results = list(JobRunner(cm, progress=False).run(_quick(demo)))
    return cm, results, recorder


@pytest.fixture(scope="module")
def offloaded_whole(demo):
    """The same under auto offload with victims evicted whole (``shrink_victims`` off), uses recorded."""
    cm = ComponentsManager()
    cm.enable_auto_cpu_offload(device=SimulatedDevice(demo.budget), memory_reserve_margin=demo.margin)
    cm.offload_engine.shrink_victims = False
    with UseRecorder(cm.offload_engine) as recorder:
        results = list(JobRunner(cm, progress=False).run(_quick(demo)))
    return cm, results, recorder


@pytest.fixture(scope="module")
def plain(demo):
    """The same jobs on a manager without offload."""
    return list(JobRunner(ComponentsManager(), progress=False).run(_quick(demo)))


def _rows(table, load_id_part):
    """The table's model rows whose load ID contains ``load_id_part``."""
    return [line for line in table.splitlines() if f"{load_id_part}|" in line]


def test_the_family_ships_the_scenario():
    """FAMILY.demo is the seed scenario, which `modular run` runs without a repo."""
    assert FAMILY.demo is seed_scenario


def test_shared_components_are_loaded_once(offloaded, demo):
    """One object per shared component, by the base repo's load ID; one transformer per repo."""
    cm, results, _ = offloaded
    base = demo.jobs[0].repo
    for name in SHARED:
        ids = cm.get_ids(name)
        assert len(ids) == 1, name
        assert cm.get_model_info(ids[0], "load_id")["load_id"] == f"{base}|{name}|null|null"
    transformers = [cm.get_model_info(i, "load_id")["load_id"] for i in cm.get_ids("transformer")]
    assert transformers == [f"{job.repo}|transformer|null|null" for job in demo.jobs]
    assert [result.loaded for result in results[1:]] == [("transformer",), ("transformer",)]
    assert all(result.pipeline.vae is results[0].pipeline.vae for result in results)


def test_each_table_shows_its_transformer_resident_and_no_other(offloaded, demo):
    """After each workflow the table shows its transformer on the device and the others (loaded so far) off it."""
    _, results, _ = offloaded
    names = ["tiny-flux-dev", "tiny-flux-canny-dev", "tiny-flux-depth-dev"]
    for number, (result, own) in enumerate(zip(results, names)):
        for name in names[: number + 1]:
            rows = _rows(result.table, f"{name}|transformer")
            expected = "sim(sim)" if name == own else "cpu(sim)"
            assert len(rows) == 1 and f"| {expected} " in rows[0], (result.job.name, name, rows)
        for name in names[number + 1 :]:
            assert _rows(result.table, f"{name}|transformer") == []


def _names(model_ids):
    return sorted(m.rsplit("_", 1)[0] for m in model_ids)


def test_t5_keeps_a_prefix_while_each_transformer_runs_and_only_transformers_leave_whole(offloaded, demo):
    """Each transformer's room comes from T5, which keeps a prefix (its tail comes back for the next
    workflow, making a transformer shrink in turn); the next transformer evicts the previous one whole.
    Behind T5's prefix the VAE finds its room by shrinking CLIP once. The VAE never leaves."""
    cm, _, _ = offloaded
    log = cm.offload_log
    assert _names(m for decision in log for m in decision.evicted) == ["transformer"] * 2
    shrunk = [decision.model_id for decision in log if decision.reason == "shrink"]
    assert _names(shrunk) == ["text_encoder"] + ["text_encoder_2"] * 3 + ["transformer"] * 2
    engine = cm.offload_engine
    resident = engine.resident_ids()
    assert _names(resident) == ["text_encoder", "text_encoder_2", "transformer", "vae"]
    partly = {m.rsplit("_", 1)[0] for m in resident if engine.residency(m).resident_share is not None}
    assert partly == {"text_encoder_2"}


def test_with_victims_evicted_whole_t5_and_the_previous_transformer_leave_and_small_models_stay(
    offloaded_whole,
):
    """With ``shrink_victims`` off, T5 and the previous transformer are evicted as the next workflow's models
    come; CLIP and the VAE stay."""
    cm, _, _ = offloaded_whole
    evicted = [m for decision in cm.offload_log for m in decision.evicted]
    assert _names(evicted) == ["text_encoder_2"] * 3 + ["transformer"] * 2
    assert _names(cm.offload_engine.resident_ids()) == ["text_encoder", "transformer", "vae"]


def test_device_bytes_never_exceed_the_budget(offloaded, demo):
    """At every model use the resident weights fit in the budget less the margin."""
    cm, _, recorder = offloaded
    usable = demo.budget - demo.margin
    assert max(sum(use.resident.values()) for use in recorder.uses) <= usable
    assert cm.offload_engine.peak_resident_bytes <= usable


def test_nothing_is_copied_back(offloaded, offloaded_whole):
    """Victims leave (2 whole and 6 down to a prefix; 5 whole with shrinking off), and not one byte moves
    device-to-host either way."""
    for (cm, _, _), evictions, shrinks in ((offloaded, 2, 6), (offloaded_whole, 5, 0)):
        log = cm.offload_log
        assert (log.total_evictions, [d.reason for d in log].count("shrink")) == (evictions, shrinks)
        assert log.total_bytes_to_host == 0


@pytest.mark.parametrize("run", ["offloaded", "offloaded_whole"])
def test_images_equal_the_runs_without_offload(run, plain, request):
    """Every workflow's image, and every control image, equals the one made without offload, with victims
    shrunk to a prefix (the default) or evicted whole."""
    _, results, _ = request.getfixturevalue(run)
    for with_offload, without in zip(results, plain):
        assert torch.equal(torch.from_numpy(with_offload.images), torch.from_numpy(without.images))
        for name, image in with_offload.derived.items():
            assert np.array_equal(np.asarray(image), np.asarray(without.derived[name])), name


def test_shrinking_victims_moves_fewer_bytes_than_evicting_them_whole(offloaded, offloaded_whole):
    """The same model uses; keeping T5's prefix saves its bytes at every workflow after the first."""
    shrinking, whole = offloaded[0].offload_log, offloaded_whole[0].offload_log
    uses = [
        [value.rsplit("_", 1)[0] for kind, value in recorder.events if kind == "use"]
        for _, _, recorder in (offloaded, offloaded_whole)
    ]
    assert uses[0] == uses[1] and len(uses[0]) > 0
    assert shrinking.total_bytes_to_device < whole.total_bytes_to_device


def test_the_replay_reproduces_the_run_and_prices_the_peer(offloaded, offloaded_whole, demo):
    """Replaying the recorded uses with our strategy gives the totals of the run with whole victims (a
    replay moves whole models); the peer's rule copies back every byte it evicts."""
    cm, _, recorder = offloaded_whole
    args = (recorder.events, recorder.sizes, demo.budget, demo.margin)
    ours = replay(*args, NextUseStrategy())
    log = cm.offload_log
    assert (ours.bytes_to_device, ours.bytes_to_host, ours.evictions) == (
        log.total_bytes_to_device,
        0,
        log.total_evictions,
    )
    cm, _, recorder = offloaded
    args = (recorder.events, recorder.sizes, demo.budget, demo.margin)
    peer = replay(*args, SmallestSufficientSet(), copies_back=True)
    t5 = recorder.sizes[cm.get_ids("text_encoder_2")[0]]
    base, canny, _ = (recorder.sizes[model] for model in cm.get_ids("transformer"))
    assert peer.bytes_to_host == 3 * t5 + base + canny


def test_seed_scale_models_weigh_the_real_ones_in_mb(tmp_path):
    """The seed-scale repo's models weigh FLUX.1's sizes with GiB read as MiB (within 2%)."""
    from modular import ModularPipeline

    pipe = ModularPipeline.from_pretrained(make_seed_scale_repo(tmp_path / "repo"))
    pipe.load_components(torch_dtype=torch.float32)
    sizes = {name: module_nbytes(getattr(pipe, name)) / MiB for name in ("transformer", "text_encoder_2")}
    assert sizes == pytest.approx({"transformer": 22.17, "text_encoder_2": 8.87}, rel=0.02)
    assert module_nbytes(pipe.text_encoder) < MiB and module_nbytes(pipe.vae) < MiB


def test_edge_map_marks_the_strongest_gradients():
    """edge_map is an RGB image of the input's size, black with the strongest-gradient fifth white."""
    image = np.random.default_rng(0).random((32, 48, 3), dtype=np.float32)
    edges = edge_map(image)
    pixels = np.asarray(edges)
    assert edges.mode == "RGB" and edges.size == (48, 32)
    assert set(np.unique(pixels)) == {0, 255}
    assert (pixels[..., 0] == 255).mean() == pytest.approx(0.2, abs=0.02)


def test_depth_like_map_spans_dark_to_bright_and_is_nearer_below():
    """depth_like_map is an RGB image of the input's size, stretched to 0..255, brighter at the bottom."""
    flat = np.full((32, 32, 3), 0.5, dtype=np.float32)
    depth = np.asarray(depth_like_map(flat))[..., 0]
    assert depth.shape == (32, 32) and depth.min() == 0 and depth.max() == 255
    assert depth[-1].mean() > depth[0].mean()


def test_control_maps_refuse_what_is_not_an_rgb_image():
    """A control map of an array that is not [H, W, 3] is a ValueError naming the shape."""
    with pytest.raises(ValueError, match=r"\[H, W, 3\] \(got shape \[8, 8\]\)"):
        edge_map(np.zeros((8, 8)))
