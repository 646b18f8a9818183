"""What the engine reports (Residency) and how probes and strategies describe themselves, without class-name checks."""

import pytest
import torch

from offload import (
    LRUStrategy,
    MemoryProbe,
    NextUseStrategy,
    OffloadEngine,
    Residency,
    SimulatedDevice,
    strategy_name,
)
from offload.records.messages import device_name
from tests.offload.helpers import MetaProbe, call, sized


def test_residency_of_an_attached_model_follows_its_calls():
    """An attached model is reported off the device before its first call and on it after."""
    engine = OffloadEngine(SimulatedDevice(100), memory_reserve_margin=0)
    module = sized(40)
    engine.attach("a", module)
    facts = Residency(attached=True, resident=False, device="sim", execution_device=torch.device("cpu"))
    assert engine.residency("a") == facts
    call(module)
    assert engine.residency("a").resident


def test_residency_of_an_unknown_id_is_neither_attached_nor_resident():
    """An id the engine does not hold is reported as not attached and not resident (no KeyError)."""
    engine = OffloadEngine(SimulatedDevice(100, name="gpu-sim"), memory_reserve_margin=0)
    assert engine.residency("nope") == Residency(
        attached=False, resident=False, device="gpu-sim", execution_device=torch.device("cpu")
    )


def test_residency_on_the_host_counts_every_model_resident():
    """device='cpu' reports every attached model resident on 'cpu'."""
    engine = OffloadEngine("cpu")
    engine.attach("m", sized(40))
    assert engine.residency("m") == Residency(
        attached=True, resident=True, device="cpu", execution_device=torch.device("cpu")
    )


class _Sized(MemoryProbe):
    """A probe that knows its total, to check the default description."""

    @property
    def execution_device(self):
        return torch.device("meta")

    def free_bytes(self):
        return 500

    def total_bytes(self):
        return 1000


class _Budgeted(SimulatedDevice):
    """A subclass of SimulatedDevice keeps its description."""


def test_probes_describe_themselves():
    """A probe's description is its name and size; a simulated device (and its subclasses) names its budget."""
    assert device_name(_Sized()) == "meta (total 1000 B)"
    assert device_name(MetaProbe(1000)) == "meta"
    assert device_name(SimulatedDevice(1000)) == "sim (budget 1000 B)"
    assert device_name(_Budgeted(1000, name="fake")) == "fake (budget 1000 B)"


class _Named:
    name = "mine"

    def select_victims(self, request):
        return []


class _Unnamed:
    def select_victims(self, request):
        return []


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (NextUseStrategy(), "NextUseStrategy"),
        (LRUStrategy(), "LRUStrategy"),
        (_Named(), "mine"),
        (_Unnamed(), "_Unnamed"),
    ],
)
def test_strategy_name_is_its_name_else_its_class(strategy, expected):
    """strategy_name reads a strategy's name attribute, falling back to its class's name."""
    assert strategy_name(strategy) == expected
