"""What the cancel tests share: the offload settings they run under, a gate that holds a call inside one model
forward until the test lets it go, and the check that a call left nothing behind."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from components.model_calls import MODEL_CALLS
from modular import ComponentsManager, ModularPipeline
from offload import SimulatedDevice, module_nbytes
from tests.offload.helpers import check_host_copies_fit
from tests.offload.test_running_totals import check_totals

MODELS = ("text_encoder", "unet", "vae")
#: Bounded waits: a test that would hang fails after this many seconds instead.
WAIT = 60.0
#: Steps of every call here: 3 inference steps are 4 timesteps of the tiny repo's PNDM scheduler.
STEPS = 3
#: Where the tiny SD pipeline's blocks are, by name (as ``CallCancelled.block`` and progress events name them).
FIRST_BLOCK = "check_inputs.check_inputs"
AFTER_TEXT_ENCODER = "input"
LOOP = "denoise.denoise"


def run(pipe: ModularPipeline, seed: int = 0, **watching: Any) -> torch.Tensor:
    """One seeded call: the decoded images as a tensor."""
    generator = torch.Generator().manual_seed(seed)
    return pipe(
        prompt="a cat",
        num_inference_steps=STEPS,
        generator=generator,
        output_type="pt",
        output="images",
        **watching,
    )


def sizes(pipe: ModularPipeline) -> dict[str, int]:
    return {name: module_nbytes(getattr(pipe, name)) for name in MODELS}


def offload_on(cm: ComponentsManager, pipe: ModularPipeline, mode: str, tmp_path: Any = None) -> None:
    """Auto offload as ``mode`` says, each with evictions at every change of model:

    - ``"plain"``: none;
    - ``"offload"``: a simulated device that holds any one model, never two;
    - ``"host"``: the same, and no host copy held beyond it (copies spill to ``tmp_path``);
    - ``"stream"``: a device that holds three quarters of the UNet, which streams.
    """
    if mode == "plain":
        return
    largest = max(sizes(pipe).values())
    if mode == "stream":
        device = SimulatedDevice(int(0.75 * sizes(pipe)["unet"]))
        cm.enable_auto_cpu_offload(device=device, memory_reserve_margin=0, wait_timeout=WAIT)
        return
    host = {"host_budget": 1, "spill_folder": tmp_path / "spill"} if mode == "host" else {}
    cm.enable_auto_cpu_offload(
        device=SimulatedDevice(largest + 1024), memory_reserve_margin=0, wait_timeout=WAIT, **host
    )


def assert_left_clean(cm: ComponentsManager, *pipes: ModularPipeline) -> None:
    """Nothing of a call is left: no model counted running (offload's and the model-change tracker's), the
    engine's totals equal its ledger, host copies within their budget, every model fits the device, and the
    pipelines' interrupt flags down."""
    for pipe in pipes:
        models = [getattr(pipe, name) for name in MODELS]
        for name, model in zip(MODELS, models, strict=True):
            assert MODEL_CALLS.running_count(model) == 0, f"{name} still counted running"
        with MODEL_CALLS.changing(models, "a change after the call", timeout=1):
            pass  # a change of the models (a LoRA, a removal) goes ahead at once: no call holds them
        assert pipe.interrupt is False
    if cm.auto_offload_enabled:
        engine = cm.offload_engine
        assert engine.running_ids() == []
        check_totals(engine)
        check_host_copies_fit(engine)
        assert engine.probe.free_bytes() >= 0


class ForwardGate:
    """Holds a call in one thread inside a model's forward until the test releases it.

    ``model``'s forward pre-hook, in the thread ``pipe``'s call runs in (``target_thread``, set when the call
    starts), waits at its ``at``-th forward (1-based) after telling the test (``inside``); other threads pass.
    Also counts the forwards that call ran. ``signal`` is called (in the call's thread) before it waits.
    """

    def __init__(self, model: torch.nn.Module, at: int, signal: Callable[[], None] | None = None) -> None:
        self.at = at
        self.signal = signal
        self.inside, self.release = threading.Event(), threading.Event()
        self.forwards = 0
        self.target_thread: int | None = None
        self._handle = model.register_forward_pre_hook(self._pre_forward)

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        if threading.get_ident() != self.target_thread:
            return
        self.forwards += 1
        if self.forwards == self.at:
            if self.signal is not None:
                self.signal()
            self.inside.set()
            assert self.release.wait(WAIT), "the test never released the forward"

    def remove(self) -> None:
        self._handle.remove()


def call_in_thread(target: Callable[[], Any], *gates: ForwardGate) -> tuple[threading.Thread, dict]:
    """Start ``target`` in a thread (the ``gates``' ``target_thread``); the dict gets its ``"result"`` or its
    ``"error"``."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        for gate in gates:
            gate.target_thread = threading.get_ident()
        try:
            outcome["result"] = target()
        except BaseException as error:  # the test reads it
            outcome["error"] = error

    thread = threading.Thread(target=work)
    thread.start()
    return thread, outcome


def joined(thread: threading.Thread) -> None:
    thread.join(WAIT)
    assert not thread.is_alive(), "the call did not end"
