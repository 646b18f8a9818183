"""Calls in several threads on one engine: waiting for running models, its limits, and detaching mid-call."""

import threading
import time

import pytest
import torch

from offload import (
    ModelTooLargeError,
    OffloadDeadlockError,
    OffloadEngine,
    OffloadTimeoutError,
    SimulatedDevice,
)
from tests.offload.helpers import call, sized


class Blocking(torch.nn.Linear):
    """A bias-free Linear of ``nbytes`` whose forward signals ``started`` and waits for ``release``."""

    def __init__(self, nbytes):
        super().__init__(nbytes // 4, 1, bias=False)
        self.started, self.release = threading.Event(), threading.Event()

    def forward(self, x):
        self.started.set()
        assert self.release.wait(10), "the test never released the forward"
        return super().forward(x)


class Outer(torch.nn.Linear):
    """A bias-free Linear of ``nbytes`` whose forward also calls ``inner`` (a hooked model), after ``barrier``."""

    def __init__(self, nbytes, inner, barrier=None):
        super().__init__(nbytes // 4, 1, bias=False)
        self.inner, self.barrier = [inner], barrier  # in a list: not a submodule

    def forward(self, x):
        if self.barrier is not None:
            self.barrier.wait(10)
        return super().forward(x) + call(self.inner[0])


class Worker(threading.Thread):
    """Runs ``function`` and keeps its result or error."""

    def __init__(self, function, name=None):
        super().__init__(name=name, daemon=True)
        self.function, self.result, self.error = function, None, None

    def run(self):
        try:
            self.result = self.function()
        except BaseException as error:  # checked by the test
            self.error = error


def engine_with(budget, modules, wait_timeout=600.0):
    engine = OffloadEngine(SimulatedDevice(budget), memory_reserve_margin=0, wait_timeout=wait_timeout)
    for name, module in modules.items():
        engine.attach(name, module)
    return engine


def test_a_model_that_fits_alone_waits_for_a_running_one():
    """A call whose room is held by another thread's running model waits, then evicts it and runs."""
    a, b = Blocking(600), sized(600)
    expected = call(b)
    engine = engine_with(1000, {"a": a, "b": b})
    holder = Worker(lambda: call(a))
    holder.start()
    assert a.started.wait(10)
    waiter = Worker(lambda: call(b))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not engine.is_resident("b")
    a.release.set()
    holder.join(10)
    waiter.join(10)
    assert holder.error is None and waiter.error is None
    assert torch.equal(waiter.result, expected)
    assert engine.resident_ids() == ["b"] and engine.log[-1].evicted == ("a",)


def test_the_wait_timeout_error_names_what_it_waited_for():
    """Past wait_timeout, OffloadTimeoutError (a TimeoutError) names the running model, its thread and sizes."""
    a, b = Blocking(600), sized(600)
    engine = engine_with(1000, {"a": a, "b": b}, wait_timeout=0.2)
    holder = Worker(lambda: call(a), name="holder")
    holder.start()
    assert a.started.wait(10)
    try:
        with pytest.raises(OffloadTimeoutError) as info:
            call(b)
    finally:
        a.release.set()
        holder.join(10)
    assert str(info.value) == (
        "model 'b' (600 B) waited 0.2 s for room on sim (budget 1000 B) and gave up: still running in other "
        "threads: 'a' (600 B) in thread 'holder' (at most 400 B can be made free without them). Raise "
        "wait_timeout (enable_auto_cpu_offload(..., wait_timeout=...)), run fewer calls at once, or use a "
        "larger device."
    )
    assert isinstance(info.value, TimeoutError)
    assert holder.error is None and engine.resident_ids() == ["a"]


def test_wait_timeout_must_be_a_positive_number():
    """wait_timeout rejects non-numbers (TypeError) and zero, negative or infinite values (ValueError)."""
    with pytest.raises(TypeError, match=r"wait_timeout must be a number of seconds \(got '5'"):
        OffloadEngine(SimulatedDevice(10), wait_timeout="5")
    with pytest.raises(ValueError, match=r"positive, finite number of seconds \(got 0\)"):
        OffloadEngine(SimulatedDevice(10), wait_timeout=0)
    engine = OffloadEngine(SimulatedDevice(10), wait_timeout=2)
    with pytest.raises(ValueError, match=r"\(got inf\)"):
        engine.wait_timeout = float("inf")
    assert engine.wait_timeout == 2.0


def test_a_nested_call_that_needs_its_callers_room_fails_at_once():
    """A model called inside another's forward that fits only if its caller left raises, without waiting."""
    inner = sized(700)
    outer = Outer(400, inner)
    engine = engine_with(1000, {"outer": outer, "inner": inner}, wait_timeout=30)
    start = time.monotonic()
    with pytest.raises(ModelTooLargeError) as info:
        call(outer)
    assert time.monotonic() - start < 5
    assert str(info.value) == (
        "model 'inner' needs 700 B but at most 600 B can be made free on sim (budget 1000 B) without evicting "
        "'outer' (400 B), running in this thread now: a model called from inside another model's forward "
        "cannot evict it, and waiting would never end. Use a larger device or a smaller memory_reserve_margin, "
        "or give models that call each other room on the device together."
    )
    assert engine.running_ids() == []


def test_two_threads_waiting_on_each_other_stop_one_and_finish_the_other():
    """Two nested calls each needing the other's running room: one raises OffloadDeadlockError, one finishes."""
    barrier = threading.Barrier(2)
    p, q = sized(300), sized(300)
    x, z = Outer(500, p), Outer(500, q)
    expected = {"x": call(x), "z": call(z)}
    x.barrier = z.barrier = barrier
    engine = engine_with(1000, {"x": x, "z": z, "p": p, "q": q}, wait_timeout=30)
    workers = [Worker(lambda: call(x), name="T1"), Worker(lambda: call(z), name="T2")]
    start = time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(20)
    assert time.monotonic() - start < 10
    failed = [w for w in workers if w.error is not None]
    finished = [w for w in workers if w.error is None]
    assert len(failed) == 1 and len(finished) == 1
    assert isinstance(failed[0].error, OffloadDeadlockError)
    name = finished[0].name
    mine, theirs = ("z", "x") if name == "T1" else ("x", "z")
    wanted, waits = ("q", "p") if name == "T1" else ("p", "q")
    assert str(failed[0].error) == (
        f"model '{wanted}' (300 B) cannot be placed on sim (budget 1000 B): the room it needs is held by models "
        f"running in other threads, each of which waits for room this thread holds (thread '{name}' runs "
        f"'{theirs}' (500 B) and waits for '{waits}' (300 B); this thread runs '{mine}' (500 B)). No waiting can "
        "end this cycle, so this call stops and the others go on. Use a larger device, or do not call hooked "
        "models from inside other models' forwards in several threads at once."
    )
    assert torch.equal(finished[0].result, expected[theirs])
    assert engine.running_ids() == []


def test_close_waits_for_a_running_call_which_finishes_with_its_output():
    """close() in one thread while another is inside a forward waits for it; the call returns its output."""
    a = Blocking(400)
    a.release.set()
    expected = call(a)
    a.release.clear()
    a.started.clear()  # set by the call above: the wait below must see the worker's own call start
    engine = engine_with(1000, {"a": a})
    runner = Worker(lambda: call(a))
    runner.start()
    assert a.started.wait(10)
    closer = Worker(engine.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive() and engine.has_hook("a")
    a.release.set()
    runner.join(10)
    closer.join(10)
    assert runner.error is None and closer.error is None
    assert torch.equal(runner.result, expected)
    assert engine.attached_ids() == [] and not hasattr(a, "_hf_hook")


def test_detach_from_inside_the_models_own_call_is_refused():
    """detach() of a model from inside its own forward raises RuntimeError; the model stays attached."""
    engine = OffloadEngine(SimulatedDevice(1000), memory_reserve_margin=0)
    errors = []

    class SelfDetaching(torch.nn.Linear):
        def forward(self, x):
            try:
                engine.detach("m")
            except RuntimeError as error:
                errors.append(str(error))
            return super().forward(x)

    module = SelfDetaching(4, 1, bias=False)
    engine.attach("m", module)
    call(module)
    assert errors == [
        "detach('m') was called from inside a call of ['m'] in this thread; taking a model off mid-call would "
        "pull its weights away under it. Call it after the call returns."
    ]
    assert engine.has_hook("m")
