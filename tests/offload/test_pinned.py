"""Pinned models under auto offload: they stay where they are, are never victims, and their bytes are used."""

import diffusers
import pytest
import torch

import offload
from blocks.stable_diffusion import make_tiny_repo
from components import ComponentsManager
from modular import ModularPipeline
from offload import (
    ModelTooLargeError,
    NextUseStrategy,
    OffloadEngine,
    OffloadStrategy,
    SimulatedDevice,
    StrategyError,
    module_nbytes,
    pin,
    unpin,
)

from .helpers import MetaProbe, call, sized


class Recording(NextUseStrategy):
    """NextUseStrategy that keeps every request it was asked."""

    def __init__(self):
        self.requests = []

    def select_victims(self, request):
        self.requests.append(request)
        return super().select_victims(request)


def engine_with(budget, strategy=None):
    return OffloadEngine(SimulatedDevice(budget), memory_reserve_margin=0, strategy=strategy)


# -- the budget ------------------------------------------------------------------------------------


def test_a_pinned_model_uses_the_simulated_device_from_attach_and_logs_it():
    """Its bytes are used as soon as it is attached; it is listed as pinned, not among placed residents."""
    engine = engine_with(10_000)
    engine.attach("p", sized(4000), pinned=True)
    assert engine.probe.free_bytes() == 6000
    assert engine.pinned_ids() == ["p"] and engine.resident_ids() == []
    assert engine.residency("p").pinned == "sim" and engine.residency("p").resident
    assert [(d.model_id, d.reason, d.bytes_to_device) for d in engine.log] == [("p", "pinned", 0)]


def test_the_room_a_pinned_model_holds_forces_an_eviction_that_would_not_happen_without_it():
    """a and b fit together in 10 kB; beside a pinned 4 kB model they do not, so calling b evicts a."""
    for pinned, expected_victims in [(False, []), (True, [("a",)])]:
        engine = engine_with(10_000)
        a, b = sized(4000), sized(4000)
        engine.attach("a", a)
        engine.attach("b", b)
        engine.attach("p", sized(4000), pinned=pinned)
        call(a)
        call(b)
        assert [d.evicted for d in engine.log if d.evicted] == expected_victims


def test_a_pinned_model_is_never_offered_to_the_strategy():
    """Across calls that force evictions, no request lists the pinned model among the candidates."""
    strategy = Recording()
    engine = engine_with(9000, strategy)
    models = {name: sized(4000) for name in "abc"}
    for name, module in models.items():
        engine.attach(name, module)
    pinned = sized(1000)
    engine.attach("p", pinned, pinned=True)
    for name in "abcabc":
        call(models[name])
        call(pinned)
    assert strategy.requests, "the budget was meant to force evictions"
    assert all("p" not in request.residents for request in strategy.requests)
    assert engine.pinned_ids() == ["p"] and engine.probe.used_bytes() <= 9000


def test_pinning_a_model_beside_placed_ones_evicts_what_the_strategy_picks_to_keep_the_margin():
    """On a full simulated device, attaching a pinned model evicts placed models (not running) to make room,
    in its "pinned" log row; the pinned model itself is then never a victim."""
    engine = engine_with(10_000)
    a, b = sized(4000), sized(4000)
    engine.attach("a", a)
    engine.attach("b", b)
    call(a)
    call(b)
    engine.attach("p", sized(4000), pinned=True)
    row = engine.log[-1]
    assert (row.model_id, row.reason, row.evicted) == ("p", "pinned", ("a",))
    assert engine.resident_ids() == ["b"] and engine.probe.used_bytes() == 8000
    call(a)
    assert engine.log[-1].evicted == ("b",) and engine.pinned_ids() == ["p"]


def test_a_pinned_model_of_many_blocks_is_never_streamed():
    """A pinned model with blocks, larger than what is left beside a placed model, is not split or streamed:
    its only log row is "pinned" (which evicted the placed model), and it reports no resident share."""

    class Tower(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(32, 32) for _ in range(8))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    tower = Tower()
    expected = tower(torch.ones(1, 32))
    engine = engine_with(module_nbytes(tower) + 2000)
    a = sized(4000)
    engine.attach("a", a)
    call(a)
    engine.attach("tower", tower, pinned=True)
    for _ in range(2):
        assert torch.equal(tower(torch.ones(1, 32)), expected)
    assert [(d.reason, d.evicted) for d in engine.log if d.model_id == "tower"] == [("pinned", ("a",))]
    assert engine.residency("tower").resident_share is None


def test_a_strategy_that_names_the_pinned_model_raises_strategy_error_and_moves_nothing():
    """The pinned model is no victim: naming it is a StrategyError that says why; nothing moved."""

    class NamesThePinned(OffloadStrategy):
        def select_victims(self, request):
            return ["p"]

    engine = engine_with(8000, NamesThePinned())
    a, b = sized(4000), sized(4000)
    engine.attach("a", a)
    engine.attach("b", b)
    engine.attach("p", sized(4000), pinned=True)
    call(a)
    with pytest.raises(StrategyError, match=r"\['p'\] pinned: never moved, never a victim"):
        call(b)
    assert engine.resident_ids() == ["a"] and engine.pinned_ids() == ["p"]
    assert engine.probe.used_bytes() == 8000


def test_a_strategy_naming_the_pinned_model_at_its_attach_leaves_it_unattached():
    """Room made at attach is the strategy's choice too: naming the newcomer raises and nothing changes."""

    class NamesThePinned(OffloadStrategy):
        def select_victims(self, request):
            return [request.model_id]

    engine = engine_with(8000, NamesThePinned())
    a, pinned = sized(8000), sized(4000)
    engine.attach("a", a)
    call(a)
    with pytest.raises(StrategyError, match=r"\['p'\] pinned: never moved, never a victim"):
        engine.attach("p", pinned, pinned=True)
    assert engine.attached_ids() == ["a"] and engine.resident_ids() == ["a"]
    assert engine.probe.used_bytes() == 8000 and not hasattr(pinned, "_hf_hook")


# -- it never moves ----------------------------------------------------------------------------------


def test_no_hook_moves_a_pinned_model_on_a_device_that_moves_weights():
    """On a probe that really moves tensors (to meta), the pinned model's weights stay on the CPU, its input
    goes to the CPU, and its output equals the model's own; a placed model beside it moves."""
    engine = OffloadEngine(MetaProbe(10_000), memory_reserve_margin=0)
    pinned, placed = sized(400), sized(400)
    expected = call(pinned)
    pointer = pinned.weight.data_ptr()
    engine.attach("p", pinned, pinned=True)
    engine.attach("m", placed)
    assert engine.residency("p").pinned == "cpu"
    assert torch.equal(call(pinned), expected)  # a placed model's input would have gone to meta
    call(placed)
    assert placed.weight.device.type == "meta"
    assert pinned.weight.device.type == "cpu" and pinned.weight.data_ptr() == pointer
    engine.evict("p")  # a no-op for a pinned model (callers evict before editing weights)
    engine.close()
    assert pinned.weight.data_ptr() == pointer and not hasattr(pinned, "_hf_hook")
    assert [d.reason for d in engine.log if d.model_id == "p"] == ["pinned"]


def test_out_of_memory_retry_and_evict_leave_a_pinned_model_alone():
    """The retry after an out-of-memory error evicts the placed models only; evict(pinned) does nothing."""

    class RunsOutOnce(torch.nn.Linear):
        failed = False

        def forward(self, x):
            if not self.failed:
                self.failed = True
                raise torch.OutOfMemoryError("simulated")
            return super().forward(x)

    engine = engine_with(12_000)
    other, pinned, needy = sized(4000), sized(4000), RunsOutOnce(1000, 1, bias=False)
    engine.attach("other", other)
    engine.attach("p", pinned, pinned=True)
    engine.attach("needy", needy)
    call(other)
    call(needy)
    assert engine.log[-1].reason == "oom retry" and engine.log[-1].evicted == ("other",)
    engine.evict("p")
    assert engine.pinned_ids() == ["p"] and engine.probe.free_bytes() == 12_000 - 8000
    assert all("p" not in d.evicted for d in engine.log)


def test_a_pinned_model_is_never_prefetched_or_dropped_from_the_host():
    """With prefetch on, a plan through it and a host budget smaller than it, the log has no row moving it,
    and the host tier never drops it (it has no host copy to drop: it fits no host budget and needs none)."""
    engine = OffloadEngine(SimulatedDevice(9000), memory_reserve_margin=0, host_budget=4500)
    engine.prefetch = True
    a, pinned = sized(4000), sized(4800)
    # Larger than the host budget and loaded from no file: a model like it is refused unless pinned.
    with pytest.raises(offload.HostBudgetError):
        engine.attach("q", sized(4800))
    engine.attach("p", pinned, pinned=True)
    engine.attach("a", a)
    engine.set_plan(["a", "p", "a"])
    call(a)
    call(pinned)
    call(a)
    assert [d.reason for d in engine.log if d.model_id == "p"] == ["pinned"]
    assert not engine.host_tier.on_disk("p")
    assert engine.probe.used_bytes() == 8800


def test_a_pinned_model_that_grows_is_measured_again_where_it_is():
    """A parameter added to a pinned model is counted on the simulated device at its next call; no eviction."""
    engine = engine_with(10_000)
    pinned = sized(2000)
    engine.attach("p", pinned, pinned=True)
    pinned.extra = torch.nn.Parameter(torch.zeros(250))
    call(pinned)
    assert engine.nbytes("p") == 3000 and engine.probe.free_bytes() == 7000
    assert all(not d.evicted for d in engine.log)


# -- refused ---------------------------------------------------------------------------------------


def test_a_pinned_model_larger_than_the_device_is_refused_at_attach_and_nothing_changes():
    """The error names the model, its size and the room; it is not attached and the budget is untouched."""
    engine = OffloadEngine(SimulatedDevice(6000), memory_reserve_margin=1000)
    module = sized(5200)
    with pytest.raises(
        ModelTooLargeError,
        match=r"pinned model 'big' needs 5200 B on sim.*at most 5000 B is there.*'big' was not attached",
    ):
        engine.attach("big", module, pinned=True)
    assert engine.attached_ids() == [] and not hasattr(module, "_hf_hook")
    assert engine.probe.free_bytes() == 6000 and len(engine.log) == 0


def test_enable_refuses_pinned_models_that_fill_the_device_and_leaves_offload_off():
    """Through the manager: a marked model larger than the budget is refused at enable, named, nothing hooked."""
    cm = ComponentsManager()
    big = pin(sized(8000))
    cm.add("big", big)
    with pytest.raises(
        ModelTooLargeError, match=r"pinned model 'big_\d+' needs 8000 B on sim.*at most 6000 B.*left off"
    ):
        cm.enable_auto_cpu_offload(device=SimulatedDevice("6kB"), memory_reserve_margin=0)
    assert not cm.auto_offload_enabled and not hasattr(big, "_hf_hook")


def test_enable_refuses_a_model_that_cannot_fit_beside_the_pinned_ones():
    """A model that would fit the device alone but not beside a pinned model is refused, naming the pinned."""
    cm = ComponentsManager()
    cm.add("pinned", pin(sized(4000)))
    cm.add("wide", sized(4000))
    with pytest.raises(
        ModelTooLargeError,
        match=r"'wide_\d+' \(4000 B\) cannot fit beside the pinned 'pinned_\d+' on sim.*at most 3000 B",
    ):
        cm.enable_auto_cpu_offload(device=SimulatedDevice(7000), memory_reserve_margin=0)
    assert not cm.auto_offload_enabled


def test_pin_refuses_an_attached_module_and_a_non_module():
    """The mark is read at attach: pinning or unpinning an attached module raises, and nothing changes."""
    engine = engine_with(10_000)
    module = sized(400)
    engine.attach("m", module)
    with pytest.raises(ValueError, match=r"attached to auto offload as 'm'.*Detach it first"):
        pin(module)
    with pytest.raises(ValueError, match="Detach it first"):
        unpin(module)
    assert not offload.is_marked_pinned(module) and engine.pinned_ids() == []
    with pytest.raises(TypeError, match="torch.nn.Module"):
        pin("unet")


def test_unpin_makes_a_model_placed_again_at_its_next_attach():
    """A marked model is pinned at attach; unpinned and attached again, the engine places it."""
    module = pin(sized(400))
    engine = engine_with(10_000)
    engine.attach("m", module)
    assert engine.pinned_ids() == ["m"]
    engine.detach("m")
    assert engine.probe.free_bytes() == 10_000
    unpin(module)
    engine.attach("m", module)
    call(module)
    assert engine.pinned_ids() == [] and engine.resident_ids() == ["m"]


# -- the manager -------------------------------------------------------------------------------------


def _fake_bitsandbytes_by_parameter():
    """A module holding a parameter of a class named as bitsandbytes' (bitsandbytes is not installed here)."""
    fake = type("Int8Params", (torch.nn.Parameter,), {"__module__": "bitsandbytes.nn.modules"})
    module = sized(400)
    module.weight = fake(module.weight.data, requires_grad=False)
    return module


def _fake_bitsandbytes_by_config():
    """A module carrying a load-time quantizer whose config names bitsandbytes (as diffusers sets it)."""
    module = sized(400)
    config = diffusers.BitsAndBytesConfig(load_in_8bit=True)
    module.hf_quantizer = type("Quantizer", (), {"quantization_config": config})()
    return module


@pytest.mark.parametrize("make", [_fake_bitsandbytes_by_parameter, _fake_bitsandbytes_by_config])
def test_the_manager_pins_bitsandbytes_models_and_shows_them_pinned(make):
    """A bitsandbytes model is pinned at enable and when added later; the table and get_model_info say so."""
    cm = ComponentsManager()
    first = cm.add("first", make())
    cm.enable_auto_cpu_offload(device=SimulatedDevice("10kB"), memory_reserve_margin=0)
    later = cm.add("later", make())
    plain = cm.add("plain", sized(400))
    assert cm.offload_engine.pinned_ids() == [first, later]
    assert cm.get_model_info(first, "pinned") == {"pinned": "sim"}
    assert cm.get_model_info(plain, "pinned") == {"pinned": None}
    table = cm.table()
    assert f"{first} | Linear | sim(pinned)" in table and f"{later} | Linear | sim(pinned)" in table
    assert cm.offload_engine.probe.used_bytes() == 800
    cm.remove(later)
    assert cm.offload_engine.probe.used_bytes() == 400
    cm.disable_auto_cpu_offload()
    assert cm.get_model_info(first, "pinned") == {"pinned": None}


def test_a_pipeline_with_a_pinned_text_encoder_gives_the_images_it_gives_without_offload(tmp_path):
    """Tiny SD with its text encoder pinned on a budget that forces evictions: images bit-equal to the run
    without offload; the text encoder never moves, is never a victim, and stays where it was after disable."""
    repo = make_tiny_repo(tmp_path / "tiny-sd")
    cm = ComponentsManager()
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)

    def images():
        generator = torch.Generator().manual_seed(0)
        return pipe(
            prompt="a cat", num_inference_steps=2, generator=generator, output_type="pt", output="images"
        )

    expected = images()
    encoder = pin(pipe.text_encoder)
    pointers = [p.data_ptr() for p in encoder.parameters()]
    # Room for the pinned text encoder and the UNet, not for the VAE as well.
    budget = module_nbytes(encoder) + module_nbytes(pipe.unet) + 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    encoder_id = cm.get_id(encoder)
    for _ in range(2):
        assert torch.equal(images(), expected)
    evictions = [d.evicted for d in cm.offload_log if d.evicted]
    assert evictions and all(encoder_id not in victims for victims in evictions)
    assert cm.offload_engine.pinned_ids() == [encoder_id]
    cm.disable_auto_cpu_offload()
    assert [p.data_ptr() for p in encoder.parameters()] == pointers
    assert torch.equal(images(), expected)


@pytest.mark.gpu
def test_on_cuda_a_bitsandbytes_8bit_unet_stays_on_the_gpu_under_auto_offload(tmp_path):
    """A tiny SD whose UNet is bitsandbytes 8-bit, under auto offload on CUDA with a budget that forces the
    other models out: the UNet is pinned where bitsandbytes put it, never evicted, its bytes taken off the
    budget, and the images equal those of the same pipeline on CUDA without offload."""
    pytest.importorskip("bitsandbytes")
    repo = make_tiny_repo(tmp_path / "tiny-sd")
    config = {"unet": diffusers.BitsAndBytesConfig(load_in_8bit=True), "default": None}

    def pipeline(cm):
        pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
        pipe.load_components(torch_dtype=torch.float16, quantization_config=config)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def images(pipe):
        generator = torch.Generator().manual_seed(0)
        return pipe(
            prompt="a cat", num_inference_steps=2, generator=generator, output_type="pt", output="images"
        )

    plain = pipeline(ComponentsManager())
    assert plain.unet.device.type == "cuda"  # bitsandbytes loads onto the GPU
    for name in ("text_encoder", "vae"):
        getattr(plain, name).to("cuda")
    expected = images(plain)
    del plain

    cm = ComponentsManager()
    pipe = pipeline(cm)
    unet, unet_id = pipe.unet, cm.get_id(pipe.unet)
    pointers = [p.data_ptr() for p in unet.parameters()]
    cm.enable_auto_cpu_offload(device="cuda", memory_reserve_margin=0)
    engine = cm.offload_engine
    assert engine.pinned_ids() == [unet_id]
    assert engine.residency(unet_id).pinned == str(engine.execution_device)
    assert f"{engine.execution_device}(pinned)" in cm.table()
    # Room for the larger of the text encoder and the VAE only, beside the pinned UNet (already on the GPU).
    room = max(module_nbytes(pipe.text_encoder), module_nbytes(pipe.vae)) + 1024
    engine.memory_reserve_margin = engine.probe.free_bytes() - room
    for _ in range(2):
        assert torch.equal(images(pipe), expected)
    assert any(d.evicted for d in cm.offload_log)
    assert all(unet_id not in d.evicted for d in cm.offload_log)
    assert [p.data_ptr() for p in unet.parameters()] == pointers
    cm.disable_auto_cpu_offload()
    assert {p.device.type for p in unet.parameters()} == {"cuda"}
