"""Two threads calling one streamed model at once share the room reserved for its streamed groups."""

import threading
import time

import pytest
import torch

from offload import OffloadEngine, SimulatedDevice

from .helpers import GROUP, WIDTH, Tower


class PeakDevice(SimulatedDevice):
    """A simulated device that remembers the most bytes ever allocated on it."""

    def __init__(self, budget: int):
        super().__init__(budget)
        self.peak = 0
        self._count = threading.Lock()

    def on_resident(self, model_id: str, nbytes: int) -> None:
        with self._count:
            super().on_resident(model_id, nbytes)
            self.peak = max(self.peak, self.used_bytes())


def slowed(tower: Tower) -> None:
    """Make each block's forward last a moment, so that two threads' forwards overlap."""
    for block in tower.blocks:

        def forward(x, original=block.forward):
            time.sleep(0.005)
            return original(x)

        block.forward = forward


def run_in_threads(target, count: int) -> list:
    """Run ``target(i)`` in ``count`` threads started together; their results, or the first error raised."""
    start = threading.Barrier(count)
    results: list = [None] * count
    errors: list[BaseException] = []

    def run(i):
        start.wait()
        try:
            results[i] = target(i)
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)

    # Daemons: a thread stuck waiting fails the test (its result stays None) instead of hanging the run.
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize(("prefetch", "depth"), [(False, 8), (True, 11)])
def test_two_threads_on_one_streamed_model_keep_within_the_budget_and_equal_outputs(prefetch, depth):
    """A model four times the budget, called by two threads at once (two pipelines sharing it): each output
    is bit-equal to the run without offload, and the device never holds more than its budget (the footprint
    reserves one streamed group, two with prefetch, for all callers together)."""
    tower = Tower(depth=depth)
    inputs = [torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    expected = [tower(x) for x in inputs]
    slowed(tower)
    size = (depth + 1) * GROUP
    device = PeakDevice(size // 4)
    engine = OffloadEngine(device, memory_reserve_margin=0)
    engine.prefetch = prefetch
    engine.attach("tower", tower)
    rounds = 3
    for _ in range(rounds):
        outputs = run_in_threads(lambda i: tower(inputs[i]), 2)
        assert all(torch.equal(out, want) for out, want in zip(outputs, expected))
    assert engine.log[0].reason == "stream"
    assert device.peak <= device.budget
    assert device.used_bytes() == engine.log[0].bytes_to_device + (2 if prefetch else 1) * GROUP  # footprint
    assert "stream tail" in [d.reason for d in engine.log] and engine.log.total_bytes_to_host == 0


def test_a_group_called_inside_another_group_of_the_same_model_does_not_wait_for_itself():
    """A block whose forward calls another streamed block of its model (one thread) goes on beyond the
    reserved room, as it would without threads, instead of waiting for room only it holds."""
    tower = Tower(depth=4)
    inner = tower.blocks[3]
    outer_forward = tower.blocks[2].forward
    tower.blocks[2].forward = lambda x: inner(outer_forward(x))
    x = torch.randn(2, WIDTH, generator=torch.Generator().manual_seed(0))
    expected = tower(x)
    device = PeakDevice(2 * GROUP)  # base and one slot: blocks 0-3 stream
    engine = OffloadEngine(device, memory_reserve_margin=0)
    engine.attach("tower", tower)
    assert run_in_threads(lambda i: torch.equal(tower(x), expected), 1) == [True]
    # The nested block was on the device beside its caller: the device's count says so, and comes back.
    assert device.peak == 3 * GROUP and device.used_bytes() == 2 * GROUP
