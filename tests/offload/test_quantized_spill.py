"""Quantized models (torchao's tensor subclasses) under a host budget: their inner tensors are spilled once and
read back, the wrapper objects staying in their slots."""

import logging
import os

import pytest
import torch
from safetensors import safe_open
from torch.utils import _pytree as pytree
from torchao.quantization import Int8WeightOnlyConfig, quantize_  # test_tied_...: a model of its own

from components import ComponentsManager
from offload import HostBudgetError, OffloadEngine, SimulatedDevice, module_nbytes
from offload.host.disk_copies import DiskCopy, missing_from_files, read_back, write_spill
from offload.host.tensor_slots import drop_tensors, tensor_slots
from offload.records.messages import reload_hint

from .helpers import MetaProbe, Tower, check_host_copies_fit, quantized_tower
from .test_host_tier import loaded

WIDTH = 16
X = torch.randn(1, WIDTH, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(5))


def quantized(seed: int) -> Tower:
    return quantized_tower(depth=2, width=WIDTH, seed=seed)


QSIZE = module_nbytes(quantized(0))


def feed(model: torch.nn.Module) -> torch.Tensor:
    """The input of the right dtype: bf16 for a quantized tower, float32 for a plain model."""
    return model(X if isinstance(model, Tower) else X.float())


def run(cm: ComponentsManager, models: list, times: int) -> list[torch.Tensor]:
    """Call the models as a pipeline would; after each call the host copies held fit the budget (beyond it
    only by what is on the simulated device, whose weights are host memory here)."""
    outputs = []
    engine = cm.offload_engine
    for _ in range(times):
        cm.set_execution_plan(models)
        for model in models:
            outputs.append(feed(model))
            check_host_copies_fit(engine)
    return outputs


def enable(cm: ComponentsManager, tmp_path, budget: int, device: int) -> None:
    cm.enable_auto_cpu_offload(
        device=SimulatedDevice(device),
        memory_reserve_margin=0,
        host_budget=budget,
        spill_folder=tmp_path / "spill",
    )


def decisions(cm: ComponentsManager, reason: str) -> list[str]:
    return [decision.model_id for decision in cm.offload_log if decision.reason == reason]


def test_three_quantized_models_drop_spill_once_and_read_back(tmp_path):
    """A host budget for 1.5 quantized models: outputs equal over three rounds, each model spilled once, by
    its inner tensors."""
    models = [quantized(seed) for seed in range(3)]
    expected = [feed(model) for _ in range(3) for model in models]
    cm = ComponentsManager()
    ids = [cm.add(f"q{i}", model) for i, model in enumerate(models)]
    enable(cm, tmp_path, budget=int(1.5 * QSIZE), device=QSIZE)
    outputs = run(cm, models, times=3)
    assert all(torch.equal(a, b) for a, b in zip(outputs, expected, strict=True))
    dropped, spilled = decisions(cm, "drop host copy"), decisions(cm, "spill")
    assert len(decisions(cm, "disk read")) >= 3 and len(dropped) > len(set(dropped))  # dropped again later
    assert sorted(spilled) == sorted(set(dropped)) == sorted(ids)  # once per model
    assert all(d.bytes_to_disk == QSIZE for d in cm.offload_log if d.reason == "spill")
    with safe_open(cm.offload_engine.host_tier.spill_files()[ids[0]], framework="pt") as handle:
        assert {"inp.weight.qdata", "inp.weight.scale", "inp.bias"} <= set(handle.keys())
    cm.disable_auto_cpu_offload()
    assert all(torch.equal(feed(model), expected[i]) for i, model in enumerate(models))


def test_a_plain_model_from_its_file_beside_quantized_ones(tmp_path):
    """A plain model is read back from the file it was loaded from (nothing written for it); the quantized
    ones are spilled."""
    plain = loaded(tmp_path / "plain", 1)
    models = [plain, quantized(1), quantized(2)]
    expected = [feed(model) for _ in range(3) for model in models]
    cm = ComponentsManager()
    ids = [cm.add(name, model) for name, model in zip(["plain", "q1", "q2"], models, strict=True)]
    enable(cm, tmp_path, budget=QSIZE, device=max(QSIZE, module_nbytes(plain)))
    outputs = run(cm, models, times=3)
    assert all(torch.equal(a, b) for a, b in zip(outputs, expected, strict=True))
    assert ids[0] in decisions(cm, "drop host copy") and ids[0] in decisions(cm, "disk read")
    assert ids[0] not in decisions(cm, "spill") and sorted(decisions(cm, "spill")) == sorted(ids[1:])


def test_the_spill_file_is_written_once(tmp_path):
    """The second drop of an unchanged quantized model writes nothing: the file is the one written first."""
    models = {"a": quantized(0), "b": quantized(1)}
    engine = OffloadEngine(
        SimulatedDevice(QSIZE), memory_reserve_margin=0, host_budget=QSIZE, spill_folder=tmp_path
    )
    for model_id, model in models.items():
        engine.attach(model_id, model)
    engine.ensure_resident("a")  # b dropped, spilled
    engine.ensure_resident("b")  # b read back; a leaves the device: dropped, spilled
    path = engine.host_tier.spill_files()["a"]
    first = os.stat(path)
    engine.ensure_resident("a")  # read back; b dropped again
    engine.ensure_resident("b")  # a dropped again
    assert engine.host_tier.on_disk("a")
    assert [d.model_id for d in engine.log if d.reason == "drop host copy"] == ["b", "a", "b", "a"]
    assert [d.model_id for d in engine.log if d.reason == "spill"] == ["b", "a"]
    again = os.stat(path)
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)
    assert engine.log.total_bytes_to_disk == 2 * QSIZE
    engine.close()


def test_a_changed_quantized_model_is_spilled_again(tmp_path):
    """refresh_host_copy after an in-place change: the next drop writes the new values."""
    models = {"a": quantized(0), "b": quantized(1)}
    engine = OffloadEngine(
        SimulatedDevice(QSIZE), memory_reserve_margin=0, host_budget=QSIZE, spill_folder=tmp_path
    )
    for model_id, model in models.items():
        engine.attach(model_id, model)
    for model_id in "aba":  # b, a, then b dropped: each spilled once
        engine.ensure_resident(model_id)
    with torch.no_grad():
        models["a"].inp.weight.scale.mul_(2)
    engine.refresh_host_copy("a")
    after = feed(models["a"])
    engine.ensure_resident("b")  # a dropped again, with its new scale
    assert [d.model_id for d in engine.log if d.reason == "spill"] == ["b", "a", "a"]
    engine.close()
    assert torch.equal(feed(models["a"]), after)


def test_a_quantized_model_read_back_still_moves_to_the_device():
    """With real moves (meta device): dropped, read back and placed, it runs there; detached, its output on
    the host equals the original."""
    models = {"a": quantized(0), "b": quantized(1)}
    expected = {model_id: feed(model) for model_id, model in models.items()}
    engine = OffloadEngine(MetaProbe(QSIZE), memory_reserve_margin=0, host_budget=QSIZE)
    for model_id, model in models.items():
        engine.attach(model_id, model)
    weights = {model_id: model.inp.weight for model_id, model in models.items()}  # the host copies
    for model_id in ["a", "b", "a", "b"]:
        assert feed(models[model_id]).device.type == "meta"
    reasons = [decision.reason for decision in engine.log]
    assert "drop host copy" in reasons and "disk read" in reasons
    engine.close()  # detaches every model
    for model_id, model in models.items():
        assert model.inp.weight is weights[model_id] and model.inp.weight.device.type == "cpu"
        assert torch.equal(feed(model), expected[model_id])


def test_tied_quantized_weights_stay_one_object_after_a_read_back(tmp_path):
    """A quantized weight in two slots is spilled once per inner tensor and stays the same object."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).to(torch.bfloat16)
    quantize_(model, Int8WeightOnlyConfig())
    model[1].weight = model[0].weight
    weight, expected = model[0].weight, model(X[:, :8])
    slots = tensor_slots(model)
    assert not isinstance(slots, str)
    qdata = next(slot for slot in slots if slot.key == "0.weight.qdata")
    assert qdata.names == ["0.weight.qdata", "1.weight.qdata"] and len(qdata.places) == 2
    path = str(tmp_path / "tied.safetensors")
    write_spill(path, slots)
    drop_tensors(slots)
    assert weight.qdata.untyped_storage().nbytes() == 1 and weight.scale.isnan().all()
    read_back(slots, DiskCopy({s.key: (path, s.key) for s in slots}, 0, (0, 0, 0)), pin=False)
    assert model[0].weight is weight and model[1].weight is weight
    assert torch.equal(model(X[:, :8]), expected)


class Unwrapping(torch.Tensor):
    """A wrapper subclass with one inner tensor; every op runs on the inner one."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(
            cls, inner.shape, strides=inner.stride(), dtype=inner.dtype, device=inner.device
        )

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrapped = pytree.tree_map_only(cls, lambda t: t.inner, (args, kwargs or {}))
        out = func(*unwrapped[0], **unwrapped[1])
        # Copies of the weight (a Parameter is made by detach()) stay wrapped; results of compute do not.
        keep = {torch.ops.aten.detach.default, torch.ops.aten._to_copy.default, torch.ops.aten.clone.default}
        return cls(out) if func in keep else out


class Wrapped(Unwrapping):
    """The same, flattened by the subclass protocol (``__tensor_flatten__``), as torchao's tensors are."""

    def __tensor_flatten__(self):
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner_tensors, ctx, outer_size, outer_stride):
        return Wrapped(inner_tensors["inner"])


class Tagged(torch.Tensor):
    """A tensor subclass that cannot be flattened (no ``__tensor_flatten__``); it holds its own storage."""


def wrapped_linear(wrap) -> torch.nn.Linear:
    linear = torch.nn.Linear(4, 4)
    linear.weight = torch.nn.Parameter(wrap(linear.weight.detach()), requires_grad=False)
    return linear


def test_a_nested_wrapper_is_dropped_by_its_innermost_tensor_with_its_layout(tmp_path):
    """A wrapper of a wrapper of a transposed tensor: spilled under its nested name, read back with its
    stride, the same objects in place."""
    linear = torch.nn.Linear(4, 4)
    linear.weight = torch.nn.Parameter(Wrapped(Wrapped(linear.weight.detach().t().contiguous().t())))
    outer, middle, inner = linear.weight, linear.weight.inner, linear.weight.inner.inner
    stride, expected = inner.stride(), linear(torch.ones(1, 4))
    slots = tensor_slots(linear)
    assert not isinstance(slots, str)
    assert sorted(slot.key for slot in slots) == ["bias", "weight.inner.inner"]
    path = str(tmp_path / "nested.safetensors")
    write_spill(path, slots)
    drop_tensors(slots)
    assert middle.inner.isnan().all() and linear.weight is outer and outer.inner is middle
    read_back(slots, DiskCopy({s.key: (path, s.key) for s in slots}, 0, (0, 0, 0)), pin=False)
    assert middle.inner is not inner and middle.inner.stride() == stride == (1, 4)
    assert torch.equal(linear(torch.ones(1, 4)), expected)


def test_a_subclass_that_cannot_be_flattened_keeps_its_host_copy(tmp_path, caplog):
    """No ``__tensor_flatten__``: the model keeps its host copy, with the reason in an INFO line; the others
    drop theirs. (A wrapper subclass without it cannot be attached at all: its size cannot be measured.)"""
    tagged = torch.nn.Linear(4, 4)
    tagged.weight = torch.nn.Parameter(tagged.weight.detach().as_subclass(Tagged))
    models = {"opaque": torch.nn.Sequential(tagged)}
    models.update({f"plain{i}": torch.nn.Sequential(torch.nn.Linear(4, 4)) for i in range(2)})
    size = module_nbytes(models["plain0"])
    engine = OffloadEngine(
        SimulatedDevice(size), memory_reserve_margin=0, host_budget=size, spill_folder=tmp_path
    )
    for model_id, model in models.items():
        engine.attach(model_id, model)
    with caplog.at_level(logging.INFO, logger="offload.engine.engine"):
        for model_id in [*models, *models]:
            engine.ensure_resident(model_id)
    assert (
        "opaque keeps its host copy: 0.weight is a Tagged (torch.strided), which safetensors cannot store"
        in (caplog.text)
    )
    assert not engine.host_tier.on_disk("opaque") and "opaque" not in engine.host_tier.spill_files()
    assert any(d.reason == "drop host copy" and d.model_id.startswith("plain") for d in engine.log)
    engine.close()


def test_a_wrapper_whose_inner_tensor_is_not_an_attribute_is_refused():
    """An inner tensor behind a property cannot be pointed elsewhere: a reason naming it, nothing changed."""

    class Computed(Wrapped):
        inner = property(lambda self: self.__dict__["hidden"])  # type: ignore[assignment]

        def __init__(self, inner):
            self.__dict__["hidden"] = inner

    linear = wrapped_linear(Computed)
    before = linear.weight.inner
    assert tensor_slots(linear) == "weight is a Computed whose inner is not a plain attribute"
    assert linear.weight.inner is before


def test_a_quantized_model_larger_than_the_budget_is_refused(tmp_path):
    """Its source file holds the weights before quantization, so nothing can read it back without a spill
    written from a host copy the budget cannot hold: HostBudgetError names its inner tensors, nothing drops."""
    plain = loaded(tmp_path / "plain", 1)
    model = quantized(0)
    cm = ComponentsManager()
    cm.add("plain", plain)
    cm.add("quantized", model)
    with pytest.raises(
        HostBudgetError, match=r"no file holding the quantized form .*inp\.weight\.qdata"
    ) as caught:
        enable(cm, tmp_path, budget=QSIZE // 2, device=QSIZE)
    assert "Nothing was dropped." in str(caught.value) and not cm.auto_offload_enabled
    # The fix it offers fits a quantized model: no file can hold its quantized form for reading back.
    assert "save_pretrained" not in str(caught.value) and "pin it (offload.pin)" in str(caught.value)
    assert not os.path.exists(tmp_path / "spill") and torch.equal(feed(model), feed(quantized(0)))


def test_the_refusals_fix_keys_on_quantized_weights_not_on_the_message_text():
    """What the files lack says whether it is quantized weights (FileGaps.quantized), and the fix the refusal
    offers follows that flag: pin it or hold it unquantized, else read it back from a saved file."""
    gaps = missing_from_files(quantized(0), [])
    assert gaps is not None and gaps.quantized and gaps.where == "no file holding the quantized form"
    assert (
        reload_hint(gaps.quantized)
        == "or hold it unquantized, or pin it (offload.pin) so that it stays where it is"
    )
    plain = missing_from_files(Tower(depth=2, width=WIDTH, seed=0), [])
    assert (
        plain is not None and not plain.quantized and plain.where == "no safetensors file it was loaded from"
    )
    assert reload_hint(plain.quantized) == "or save the model with save_pretrained() and load it from there"
