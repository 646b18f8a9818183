"""Strategies written for diffusers' ComponentsManager (callables taking hooks, model id, model and execution
device, returning the hooks to offload) run behind an adapter, checked and logged like ours."""

import pytest
import torch

from blocks.stable_diffusion import make_tiny_repo
from components import ComponentsManager
from offload import OffloadEngine, PeerStrategy, SimulatedDevice, StrategyError, module_nbytes

from ..modular.tiny_sd import tiny_sd_images, tiny_sd_pipeline
from .helpers import call, sized


def engine_with(budget, sizes, strategy):
    engine = OffloadEngine(SimulatedDevice(budget), memory_reserve_margin=0, strategy=strategy)
    modules = {name: sized(n) for name, n in sizes.items()}
    for name, module in modules.items():
        engine.attach(name, module)
    return engine, modules


def offload_all(hooks, model_id, model, execution_device):
    """A peer-style strategy: offload every other model on the device."""
    return hooks


class LargestFirst:
    """A peer-style strategy object, shaped as the peer's AutoOffloadStrategy: the biggest models go first."""

    def __init__(self):
        self.seen = []

    def __call__(self, hooks, model_id, model, execution_device):
        self.seen.append((model_id, [hook.model_id for hook in hooks], model, execution_device))
        return sorted(hooks, key=lambda hook: -sum(p.numel() for p in hook.model.parameters()))[:1]


def test_a_peer_function_decides_the_evictions_and_the_log_names_it():
    """A peer function given to the engine is asked when a model does not fit; the log names it."""
    engine, modules = engine_with(500, {"a": 200, "b": 200, "c": 300}, offload_all)
    assert isinstance(engine.strategy, PeerStrategy)
    for name in ("a", "b", "c"):
        call(modules[name])
    assert engine.resident_ids() == ["c"]
    assert engine.log[-1].evicted == ("a", "b")
    assert engine.log[-1].reason == "evict: peer:offload_all"


def test_a_peer_strategy_object_sees_the_hooks_the_model_and_the_device():
    """It gets one hook per evictable resident (model_id and model), the incoming module and the device."""
    strategy = LargestFirst()
    engine, modules = engine_with(500, {"a": 100, "b": 240, "c": 300}, None)
    engine.set_strategy(strategy)
    for name in ("a", "b", "c"):
        call(modules[name])
    [(model_id, hooks, model, device)] = strategy.seen
    assert (model_id, hooks, device) == ("c", ["a", "b"], torch.device("cpu"))
    assert model is modules["c"]
    assert engine.log[-1].evicted == ("b",) and engine.log[-1].reason == "evict: peer:LargestFirst"


def test_a_peer_strategy_is_asked_only_when_the_model_does_not_fit():
    """Unlike the peer, which asks before every move, the engine asks only when room must be made."""
    strategy = LargestFirst()
    engine, modules = engine_with(1000, {"a": 100, "b": 200}, strategy)
    call(modules["a"])
    call(modules["b"])
    assert strategy.seen == []


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            lambda hooks: None,
            r"returned None for 'c'; a peer strategy returns a list of the hooks it was given",
        ),
        (lambda hooks: "a", r"returned 'a' for 'c'"),
        (lambda hooks: [object()], r"returned \[<object object at"),
    ],
)
def test_a_peer_answer_that_is_not_its_hooks_is_refused_and_nothing_moves(answer, message):
    """Anything but a list of the given hooks is a StrategyError naming the strategy; nothing moves."""

    def strategy(hooks, model_id, model, execution_device):
        return answer(hooks)

    engine, modules = engine_with(500, {"a": 200, "b": 200, "c": 300}, strategy)
    call(modules["a"])
    call(modules["b"])
    with pytest.raises(StrategyError, match=r"strategy peer:strategy " + message):
        call(modules["c"])
    assert engine.resident_ids() == ["a", "b"]


def test_a_peer_answer_that_frees_too_little_is_refused_like_ours():
    """The engine's own check holds for a peer strategy: victims that free too little move nothing."""

    def keep_all(hooks, model_id, model, execution_device):
        return []

    engine, modules = engine_with(500, {"a": 200, "b": 200, "c": 300}, keep_all)
    call(modules["a"])
    call(modules["b"])
    with pytest.raises(StrategyError, match=r"strategy peer:keep_all returned victims \[\] freeing 0 B"):
        call(modules["c"])
    assert engine.resident_ids() == ["a", "b"]


def test_a_peer_strategy_cannot_offload_by_itself():
    """A hook's offload() inside the strategy is refused: the strategy returns hooks, the engine moves them."""

    def offloads_itself(hooks, model_id, model, execution_device):
        hooks[0].offload()

    engine, modules = engine_with(500, {"a": 200, "b": 200, "c": 300}, offloads_itself)
    call(modules["a"])
    call(modules["b"])
    with pytest.raises(TypeError, match="hook 'a': return the hooks to offload from the strategy"):
        call(modules["c"])
    assert engine.resident_ids() == ["a", "b"]


def test_a_callable_of_another_shape_is_refused_naming_both_protocols():
    """A callable that does not take the peer's keywords is neither kind of strategy: TypeError, as before."""
    engine = OffloadEngine(SimulatedDevice(10), memory_reserve_margin=0)
    with pytest.raises(TypeError, match=r"or pass a strategy written for diffusers' ComponentsManager"):
        engine.set_strategy(lambda hooks: hooks)
    assert type(engine.strategy).__name__ == "NextUseStrategy"


def test_the_manager_takes_a_peer_strategy_and_outputs_stay_equal(tmp_path):
    """enable_auto_cpu_offload(offload_strategy=peer) and set_offload_strategy(peer) run a real pipeline with
    outputs equal to the run without offload, evicting as the peer strategy says, nothing copied back."""
    cm = ComponentsManager()
    pipe = tiny_sd_pipeline(make_tiny_repo(tmp_path / "repo"), cm)

    def run():
        return tiny_sd_images(pipe)

    expected = run()
    budget = module_nbytes(pipe.unet) + module_nbytes(pipe.text_encoder) + 1024
    cm.enable_auto_cpu_offload(
        device=SimulatedDevice(budget), memory_reserve_margin=0, offload_strategy=offload_all
    )
    assert torch.equal(run(), expected)
    reasons = {entry.reason for entry in cm.offload_log if entry.evicted}
    assert reasons == {"evict: peer:offload_all"}
    cm.set_offload_strategy(LargestFirst())
    assert torch.equal(run(), expected)
    assert any(entry.reason == "evict: peer:LargestFirst" for entry in cm.offload_log)
    assert sum(entry.bytes_to_host for entry in cm.offload_log) == 0
