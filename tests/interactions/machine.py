"""The state machine of the interaction tests: operations drawn over the pipelines of six families on one
manager (three from the start, one of the newer families drawn, the others as a rule draws them), each checked
against a shadow that gets the same weight-changing operations and never offloads.

Kinds of rule:

- ``both``: an operation every user can make (LoRA, IP-Adapter, quantized load, save, remove and add,
  update_components, drop and remake a pipeline). It runs on the shadow first, then on the side under
  test; both must give the same outcome (the same value, or an error of the same type).
- watched calls (tests/interactions/watched_rules.py, mixed in): a call cancelled at a drawn step, and one whose
  step callback changes the latents, on both sides.
- serving (tests/interactions/serving_rules.py, mixed in): jobs through a scheduler over the side under test's
  manager, one cancelled waiting or running; each result equals the shadow's direct call.
- ``offload``: a setting of the side under test only (auto offload on a random budget, streaming, a host
  budget with a spill folder, several simulated devices, off again). It must change no output.

After every rule: each live pipeline's output equals the shadow's (``torch.equal``), every weight a read path
returns is real, a model said to hold its source's weights holds them, and both managers tell the same
facts (``tests/interactions/checks.py``). A saved folder loads back, on a fresh manager, to the output of
the pipeline it was saved from.

To add a rule: a method with ``@rule`` (and a ``@precondition`` for the state it needs) that calls
``self.both(label, operation)`` for a user operation or ``self.on_main(...)`` for an offload setting.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from components import ComponentsManager
from components.model_info import lora_info
from offload import DeviceMoveError, HostBudgetError, ModelTooLargeError, SimulatedDevice, module_nbytes
from offload.partial.groups import split_groups
from offload.partial.streaming import smallest_layout

from .checks import assert_claims_true, assert_sides_agree, assert_weights_readable
from .serving_rules import ServingRules
from .watched_rules import WatchedCallRules
from .world import (
    DENOISER,
    IP_WEIGHTS,
    LORA_NAMES,
    LORA_TARGETS,
    NEWER_PIPELINES,
    PIPELINES,
    Files,
    Outcome,
    Side,
    generate,
    has_ip_adapter,
    load_pipeline,
    outcome,
)

#: Combinations the machine does not draw while the bug they hit is open (issue 20), each with the strict-xfail
#: test that shows it (tests/interactions/test_found.py). Remove an entry once its fix is merged.
FRACTIONS = st.sampled_from([0.3, 0.6, 0.9, 1.5, 4.0])  # of the largest model: < 1 streams it


def torchao_config() -> Any | None:
    """diffusers' int8 weight-only torchao config, or ``None`` without torchao."""
    try:
        from diffusers import TorchAoConfig
        from torchao.quantization import Int8WeightOnlyConfig
    except ImportError:
        return None
    return TorchAoConfig(Int8WeightOnlyConfig())


class InteractionMachine(WatchedCallRules, ServingRules, RuleBasedStateMachine):
    """The pipelines of ``tests/interactions/world.py`` on one manager, and their shadow (see the module
    docstring)."""

    files: Files  # set by the test before the machine runs
    trace: list[str]  # the operations of the example so far, for the failure message

    def __init__(self) -> None:
        super().__init__()
        self.main = Side(self.files)
        self.shadow = Side(self.files)
        self.expected: dict[str, Outcome] | None = None  # the shadow's outputs, until an operation changes it
        self.saved: list[tuple[str, Path, Outcome]] = []  # (pipeline, folder, output it must load back to)
        self.scratch = Path(tempfile.mkdtemp(prefix="interactions-"))
        self.counter = itertools.count()
        self.trace = []
        self.host_budget: int | None = None  # the side under test's, while offload is on

    @initialize(name=st.sampled_from(NEWER_PIPELINES))
    def add_a_newer_family(self, name):
        """One pipeline of a newer family (SD3, Flux.2, Qwen-Image, Wan) beside the three of every example."""
        self.both(f"{name} = load_pipeline(repo, cm)", lambda side: side.make(name))

    # ----- how rules run -----
    def both(self, label: str, operation: Callable[[Side], Any]) -> Outcome:
        """Run ``operation`` on the shadow, then on the side under test: the same outcome on both."""
        self.trace.append(label)
        self.expected = None
        theirs = outcome(lambda: operation(self.shadow))
        mine = outcome(lambda: operation(self.main))
        assert mine.same_as(theirs), f"{label}: {mine} under test, {theirs} without offload"
        return mine

    def on_main(self, label: str, operation: Callable[[Side], Any]) -> Outcome:
        """Run an offload setting on the side under test only."""
        self.trace.append(label)
        return outcome(lambda: operation(self.main))

    def expected_outputs(self) -> dict[str, Outcome]:
        if self.expected is None:
            self.expected = self.shadow.outputs()
        return self.expected

    def family(self, name: str) -> str:
        return PIPELINES[name]

    def live(self) -> list[str]:
        return sorted(self.shadow.live())

    def with_lora(self, fused: bool | None = None) -> list[str]:
        """Live pipelines whose shadow models hold LoRA adapters (``fused``: only those with, or without, a
        fused one)."""
        names = []
        for name, pipe in self.shadow.live().items():
            models = [pipe.components.get(key) for key in LORA_TARGETS[self.family(name)]]
            adapters = [a for model in models if model is not None for a in lora_info(model) or []]
            if adapters and (fused is None or any(a["fused"] for a in adapters) == fused):
                names.append(name)
        return names

    def with_ip_adapter(self, loaded: bool) -> list[str]:
        """Live pipelines of the families that take an IP-Adapter whose denoiser holds one (or not)."""
        return [
            n
            for n, p in self.shadow.live().items()
            if self.family(n) in self.files.ip_adapters and has_ip_adapter(p, self.family(n)) == loaded
        ]

    def folder(self, kind: str) -> Path:
        return self.scratch / f"{kind}-{next(self.counter)}"

    # ----- LoRA -----
    @precondition(lambda self: self.live())
    @rule(data=st.data(), adapter=st.sampled_from(LORA_NAMES))
    def load_lora(self, data, adapter):
        name = data.draw(st.sampled_from(self.live()), label="pipeline")
        lora = self.files.loras[self.family(name)][adapter]
        self.both(
            f"{name}.load_lora_weights({adapter!r})",
            lambda side: side.pipes[name].load_lora_weights(lora, adapter_name=adapter),
        )

    @precondition(lambda self: self.with_lora())
    @rule(data=st.data(), weight=st.sampled_from([0.0, 0.5, 1.3]))
    def set_adapters(self, data, weight):
        name = data.draw(st.sampled_from(self.with_lora()), label="pipeline")

        def set_all(side):
            pipe = side.pipes[name]
            adapters = sorted({a for names in pipe.get_list_adapters().values() for a in names})
            pipe.set_adapters(adapters, adapter_weights=[weight] * len(adapters))

        self.both(f"{name}.set_adapters(all, {weight})", set_all)

    @precondition(lambda self: self.with_lora(fused=False))
    @rule(data=st.data(), scale=st.sampled_from([0.5, 1.0]))
    def fuse_lora(self, data, scale):
        name = data.draw(st.sampled_from(self.with_lora(fused=False)), label="pipeline")
        self.both(f"{name}.fuse_lora({scale})", lambda side: side.pipes[name].fuse_lora(lora_scale=scale))

    @precondition(lambda self: self.with_lora(fused=True))
    @rule(data=st.data())
    def unfuse_lora(self, data):
        name = data.draw(st.sampled_from(self.with_lora(fused=True)), label="pipeline")
        self.both(f"{name}.unfuse_lora()", lambda side: side.pipes[name].unfuse_lora())

    @precondition(lambda self: self.with_lora())
    @rule(data=st.data())
    def unload_lora(self, data):
        name = data.draw(st.sampled_from(self.with_lora()), label="pipeline")
        self.both(f"{name}.unload_lora_weights()", lambda side: side.pipes[name].unload_lora_weights())

    @precondition(lambda self: self.with_lora())
    @rule(data=st.data(), adapter=st.sampled_from(LORA_NAMES))
    def delete_adapter(self, data, adapter):
        name = data.draw(st.sampled_from(self.with_lora()), label="pipeline")
        self.both(
            f"{name}.delete_adapters({adapter!r})", lambda side: side.pipes[name].delete_adapters(adapter)
        )

    # ----- IP-Adapter -----
    @precondition(lambda self: self.with_ip_adapter(False))
    @rule(data=st.data())
    def load_ip_adapter(self, data):
        name = data.draw(st.sampled_from(self.with_ip_adapter(False)), label="pipeline")
        repo = self.files.ip_adapters[self.family(name)]
        self.both(
            f"{name}.load_ip_adapter()", lambda side: side.pipes[name].load_ip_adapter(repo, **IP_WEIGHTS)
        )

    @precondition(lambda self: self.with_ip_adapter(True))
    @rule(data=st.data(), scale=st.sampled_from([0.0, 0.6]))
    def set_ip_adapter_scale(self, data, scale):
        name = data.draw(st.sampled_from(self.with_ip_adapter(True)), label="pipeline")
        self.both(
            f"{name}.set_ip_adapter_scale({scale})", lambda side: side.pipes[name].set_ip_adapter_scale(scale)
        )

    @precondition(lambda self: self.with_ip_adapter(True))
    @rule(data=st.data())
    def unload_ip_adapter(self, data):
        name = data.draw(st.sampled_from(self.with_ip_adapter(True)), label="pipeline")
        self.both(f"{name}.unload_ip_adapter()", lambda side: side.pipes[name].unload_ip_adapter())

    # ----- loading, sharing, lifetime -----
    # Not under a host budget: a quantized model larger than it has no file holding its quantized form, and
    # loading one is refused by design (HostBudgetError, documented at enable_auto_cpu_offload), a refusal the
    # shadow, which never offloads, has no counterpart for.
    @precondition(
        lambda self: (
            torchao_config() is not None
            and self.host_budget is None
            and any(PIPELINES[n] == "sd" for n in self.live())
        )
    )
    @rule(data=st.data())
    def load_quantized_unet(self, data):
        name = data.draw(st.sampled_from([n for n in self.live() if PIPELINES[n] == "sd"]), label="pipeline")
        config = {"unet": torchao_config(), "default": None}
        self.both(
            f"{name}.load_components(['unet'], quantization_config=int8 torchao)",
            lambda side: side.pipes[name].load_components(
                ["unet"], torch_dtype=torch.float32, quantization_config=config
            ),
        )

    @precondition(lambda self: self.live())
    @rule(data=st.data(), component=st.sampled_from(["denoiser", "text_encoder", "vae"]))
    def remove_and_add(self, data, component):
        name = data.draw(st.sampled_from(self.live()), label="pipeline")
        key = DENOISER[self.family(name)] if component == "denoiser" else component

        def remove_and_add(side):
            obj = side.pipes[name].components[key]
            component_id = side.cm.get_id(obj)
            if component_id is not None:
                side.cm.remove(component_id)
            side.cm.add(key, obj)

        self.both(f"cm.remove({name}.{key}); cm.add(...)", remove_and_add)

    @precondition(lambda self: self.live())
    @rule(data=st.data(), component=st.sampled_from(["denoiser", "text_encoder", "vae"]))
    def unload_and_load(self, data, component):
        name = data.draw(st.sampled_from(self.live()), label="pipeline")
        key = DENOISER[self.family(name)] if component == "denoiser" else component

        def reload(side):
            side.pipes[name].unload_components([key])
            side.pipes[name].load_components([key], torch_dtype=torch.float32)

        self.both(f"{name}.unload_components({key!r}); load_components({key!r})", reload)

    @precondition(lambda self: any(PIPELINES[n] == "sd" for n in self.live()))
    @rule(data=st.data())
    def update_scheduler(self, data):
        from diffusers import EulerDiscreteScheduler

        name = data.draw(st.sampled_from([n for n in self.live() if PIPELINES[n] == "sd"]), label="pipeline")

        def update(side):
            pipe = side.pipes[name]
            pipe.update_components(scheduler=EulerDiscreteScheduler.from_config(pipe.scheduler.config))

        self.both(f"{name}.update_components(scheduler=Euler)", update)

    @rule(data=st.data())
    def convert_vae_and_back(self, data):
        """``vae.to(float64)`` then ``.to(float32)``: under offload the conversion goes through the engine
        (host copy converted, size measured again), and the round trip is exact."""
        name = data.draw(st.sampled_from(self.live()), label="pipeline")

        def round_trip(side):
            vae = side.pipes[name].vae
            vae.to(torch.float64)
            vae.to(torch.float32)

        self.both(f"{name}.vae.to(float64).to(float32)", round_trip)

    @precondition(lambda self: len(self.live()) > 1)
    @rule(data=st.data())
    def drop_pipeline(self, data):
        name = data.draw(st.sampled_from(self.live()), label="pipeline")

        def drop(side):
            owned = side.drop(name)
            left = owned & set(side.cm.components)
            assert not left, f"dropped {name}, yet the manager holds its components {sorted(left)}"

        self.both(f"del {name}; gc.collect()", drop)

    @precondition(lambda self: len(self.live()) < len(PIPELINES))
    @rule(data=st.data())
    def remake_pipeline(self, data):
        name = data.draw(st.sampled_from(sorted(set(PIPELINES) - set(self.live()))), label="pipeline")
        self.both(f"{name} = load_pipeline(repo, cm)", lambda side: side.make(name))

    # ----- saving -----
    @precondition(lambda self: self.with_ip_adapter(False))
    @rule(data=st.data())
    def save_and_reload(self, data):
        name = data.draw(st.sampled_from(self.with_ip_adapter(False)), label="pipeline")
        folder = self.folder(f"saved-{name}")
        shadow_pipe = self.shadow.pipes[name]
        unfused = name in self.with_lora(fused=False)
        if unfused:  # saved as plain base weights: the output without the LoRA layers
            shadow_pipe.disable_lora()
        expected = outcome(lambda: generate(shadow_pipe, self.family(name)))
        if unfused:
            shadow_pipe.enable_lora()
        saved = self.on_main(
            f"{name}.save_pretrained({folder.name})", lambda side: side.pipes[name].save_pretrained(folder)
        )
        if saved.error is not None:  # a refusal is allowed with a LoRA (naming it), and writes nothing
            assert issubclass(saved.error, (ValueError, TypeError, RuntimeError)), saved
            assert name in self.with_lora(), f"{name}.save_pretrained refused without a LoRA: {saved}"
            assert "lora" in saved.message.lower(), f"unclear refusal: {saved}"
            assert not folder.exists(), f"save_pretrained raised {saved} but left {folder}"
            return
        self.saved.append((name, folder, expected))
        self.assert_loads_back(name, folder, expected)

    def assert_loads_back(self, name: str, folder: Path, expected: Outcome) -> None:
        got = outcome(lambda: generate(load_pipeline(folder, ComponentsManager()), self.family(name)))
        assert got.same_as(expected), f"{folder.name} loads back to {got}; {name} gave {expected} when saved"

    # ----- offload settings (the side under test only) -----
    def model_sizes(self) -> dict[str, int]:
        """The registered models' sizes, read from the shadow's (whose weights are never on disk)."""
        return {cid: module_nbytes(model) for cid, model in self.shadow.models().items()}

    def smallest_room(self) -> int:
        """The least device room every registered model can run in (its base and two streamed groups)."""
        return max(smallest_layout(split_groups(m), 2).footprint for m in self.shadow.models().values())

    @rule(
        devices=st.integers(1, 2),
        fraction=FRACTIONS,
        host=st.one_of(st.none(), st.sampled_from([0.2, 0.5, 1.0])),
        spill=st.booleans(),
    )
    def enable_offload(self, devices, fraction, host, spill):
        sizes = self.model_sizes()
        budget = max(int(fraction * max(sizes.values())), 2 * self.smallest_room())
        host_budget = None if host is None else max(int(host * sum(sizes.values())), 1)
        spill_folder = self.folder("spill") if spill else None
        device: Any = (
            SimulatedDevice(budget)
            if devices == 1
            else [SimulatedDevice(budget, name=f"sim{i}") for i in range(devices)]
        )
        engines = self.main.cm.offload_engines
        label = f"enable_auto_cpu_offload({devices} x {budget} B, host_budget={host_budget}, spill={spill})"
        done = self.on_main(
            label,
            lambda side: side.cm.enable_auto_cpu_offload(
                device=device, memory_reserve_margin=0, host_budget=host_budget, spill_folder=spill_folder
            ),
        )
        if done.error is not None:  # refused: a model too large for its share of the host budget
            assert issubclass(done.error, (HostBudgetError, ModelTooLargeError)), done
            assert self.main.cm.offload_engines == engines, f"{label} raised {done} and changed the engines"
        else:
            self.host_budget = host_budget

    @precondition(lambda self: self.main.cm.auto_offload_enabled)
    @rule()
    def disable_offload(self):
        done = self.on_main("disable_auto_cpu_offload()", lambda side: side.cm.disable_auto_cpu_offload())
        assert done.error is None, done
        assert not self.main.cm.auto_offload_enabled
        self.host_budget = None

    # ----- refused on purpose: a clear error, and nothing changed -----
    @precondition(lambda self: set(self.live()) - set(self.with_lora()))
    @rule(data=st.data())
    def fuse_without_lora(self, data):
        name = data.draw(st.sampled_from(sorted(set(self.live()) - set(self.with_lora()))), label="pipeline")
        self.refused(
            f"{name}.fuse_lora() without LoRA", ValueError, lambda side: side.pipes[name].fuse_lora()
        )

    @precondition(lambda self: self.with_lora())
    @rule(data=st.data())
    def set_unknown_adapter(self, data):
        name = data.draw(st.sampled_from(self.with_lora()), label="pipeline")
        self.refused(
            f"{name}.set_adapters('nope')", ValueError, lambda side: side.pipes[name].set_adapters("nope")
        )

    @precondition(lambda self: self.main.cm.auto_offload_enabled)
    @rule(data=st.data())
    def move_a_pipeline_by_hand(self, data):
        """``pipe.to("meta")`` under auto offload would move weights the engine places: refused, nothing moved."""
        name = data.draw(st.sampled_from(self.live()), label="pipeline")
        self.refused(
            f"{name}.to('meta') under auto offload",
            DeviceMoveError,
            lambda side: side.pipes[name].to("meta"),
            main_only=True,
        )

    @rule()
    def enable_on_a_device_too_small(self):
        engines = self.main.cm.offload_engines
        self.refused(
            "enable_auto_cpu_offload(SimulatedDevice(16))",
            ModelTooLargeError,
            lambda side: side.cm.enable_auto_cpu_offload(device=SimulatedDevice(16), memory_reserve_margin=0),
            main_only=True,
        )
        assert self.main.cm.offload_engines == engines

    def refused(
        self, label: str, error: type[Exception], operation: Callable[[Side], Any], main_only: bool = False
    ) -> None:
        """``operation`` raises ``error`` (on both sides, or the side under test only), and changes nothing: the
        shadow's outputs from before it stay the expected ones, so a change on either side shows."""
        expected = self.expected_outputs()
        self.trace.append(label)
        done = outcome(lambda: operation(self.main))
        assert done.error is not None and issubclass(done.error, error), f"{label}: {done}"
        if not main_only:
            theirs = outcome(lambda: operation(self.shadow))
            assert done.same_as(theirs), f"{label}: {done} under test, {theirs} without offload"
        self.expected = expected

    # ----- after every rule -----
    @invariant()
    def holds(self):
        """The invariants, in this order: a placeholder read is reported as itself, not as a wrong claim."""
        assert_weights_readable(self.main)
        expected, got = self.expected_outputs(), self.main.outputs()
        assert set(got) == set(expected)
        differ = {name: (got[name], expected[name]) for name in got if not got[name].same_as(expected[name])}
        assert not differ, f"after {self.trace}: outputs differ from the shadow's: {differ}"
        assert_claims_true(self.main)
        assert_sides_agree(self.main, self.shadow)
        cm = self.main.cm
        if cm.auto_offload_enabled:
            assert cm.offload_log is not None
            str(cm.offload_log)
            # The peer's record is read from the same log: its counts are the log's moves.
            summary = cm.offload_record.summary()
            assert summary["onloads"] >= summary["peak_co_residency"] >= 0, summary
            str(cm.offload_record)

    def teardown(self):
        try:
            for name, folder, expected in self.saved:
                self.assert_loads_back(name, folder, expected)
        finally:
            self.close_serving()
            self.main.close()
            self.shadow.close()
            shutil.rmtree(self.scratch, ignore_errors=True)
