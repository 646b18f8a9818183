"""Memory probes: CUDA-style free memory, the simulated device, and device resolution."""

import pytest
import torch

from offload import DeviceProbe, HostProbe, SimulatedDevice
from offload.devices.probes import resolve_probe


def test_device_probe_counts_reserved_but_unallocated_as_free(monkeypatch):
    """Free = mem_get_info free + (reserved - allocated) of PyTorch's caching allocator."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (1000, 5000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: 700)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda index: 200)
    probe = DeviceProbe(torch.device("cuda", 0))
    assert probe.free_bytes() == 1500
    assert probe.total_bytes() == 5000
    assert probe.name == "cuda:0"


def test_simulated_device_free_is_budget_minus_residents():
    """A SimulatedDevice's free bytes drop by what is resident and come back on eviction."""
    device = SimulatedDevice("1GB")
    device.on_resident("a", 300_000_000)
    assert device.free_bytes() == 700_000_000
    device.on_evicted("a")
    assert device.free_bytes() == 10**9
    assert device.execution_device == torch.device("cpu")
    assert (
        repr(device) == "SimulatedDevice(budget='953.67 MiB', used='0 B')"
    )  # '1GB' is 10**9 bytes, as in accelerate


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_device_none_without_cuda_says_what_to_pass():
    """device=None on a machine without CUDA asks for a device, 'cpu' or a SimulatedDevice."""
    with pytest.raises(ValueError, match=r"device=None picks CUDA.*SimulatedDevice\('8GB'\)"):
        resolve_probe(None)


def test_cpu_is_a_host_probe_and_bad_types_are_rejected():
    """'cpu' resolves to the no-op HostProbe; other types raise TypeError naming the value."""
    assert isinstance(resolve_probe("cpu"), HostProbe)
    with pytest.raises(TypeError, match=r"device must be None, a string.*got 3.5"):
        resolve_probe(3.5)
    with pytest.raises(ValueError, match="is not a torch device string"):
        resolve_probe("warp-drive")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_a_device_this_machine_lacks_is_a_clear_error():
    """device='cuda' without CUDA raises a ValueError naming the device and the alternatives."""
    with pytest.raises(
        ValueError, match=r"device 'cuda': torch.cuda.is_available\(\) is False on this machine"
    ):
        resolve_probe("cuda")
