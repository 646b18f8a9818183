"""The ledger really moves tensors (to the meta device here) and evicts without copying back."""

import torch

from offload import ResidencyLedger
from tests.offload.helpers import MetaProbe, sized


def test_make_resident_moves_weights_and_evict_points_back_at_the_host_copy():
    """Resident weights live on the device; eviction restores the very host tensors, copying nothing back."""
    module = sized(64)
    module.register_buffer("stat", torch.arange(4.0))
    host_weight = module.weight.data
    ledger = ResidencyLedger(MetaProbe(1000))
    ledger.add("m", module)
    assert ledger.make_resident("m") == 80
    assert module.weight.device.type == "meta" and module.stat.device.type == "meta"
    assert ledger.evict("m") == 0
    assert module.weight.data.data_ptr() == host_weight.data_ptr()
    assert torch.equal(module.stat, torch.arange(4.0))
    assert ledger.resident_bytes() == 0


def test_tied_weights_move_once_and_stay_tied():
    """A Parameter shared by two submodules is moved once and is the same object on both."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False))
    model[1].weight = model[0].weight
    ledger = ResidencyLedger(MetaProbe(1000))
    ledger.add("m", model)
    assert ledger.make_resident("m") == 64
    assert model[1].weight is model[0].weight and model[0].weight.device.type == "meta"
    ledger.evict("m")
    assert model[0].weight.device.type == "cpu"


def test_peak_resident_bytes_is_tracked():
    """The peak is the most bytes resident at once."""
    ledger = ResidencyLedger(MetaProbe(1000))
    ledger.add("a", sized(40))
    ledger.add("b", sized(80))
    ledger.make_resident("a")
    ledger.make_resident("b")
    ledger.evict("a")
    assert ledger.peak_resident_bytes == 120
    assert ledger.residents() == {"b": 80}
