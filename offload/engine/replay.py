"""Record the model uses of a run, and replay them through another strategy on a simulated device.

``UseRecorder`` watches one engine while a run goes on: every plan it is given and every model use
(what the forward hook asks for, resident already or not), with what was resident after each use.
``replay`` runs the same plans and uses through a fresh engine on a ``SimulatedDevice`` with another
strategy, so two rules can be compared on exactly the same run. Models are stood in for by modules
with one ``meta`` parameter of the model's byte size (``meta_module``): nothing is allocated. Such a
model has one group, so a replay moves whole models only (no victim shrunk to a prefix, no streaming):
it prices rules that move whole models, as the peer's does, and reproduces a run of ours only when that
run moved whole models too (``engine.shrink_victims = False``, every model fitting alone).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import attrs
import torch

from offload.devices.simulated import SimulatedDevice
from offload.engine.engine import OffloadEngine
from offload.strategies.strategy import strategy_name

__all__ = ["ReplayResult", "Use", "UseRecorder", "meta_module", "replay"]


def meta_module(nbytes: int) -> torch.nn.Module:
    """A module whose weights are exactly ``nbytes`` bytes, on the meta device (nothing allocated)."""
    module = torch.nn.Module()
    module.weight = torch.nn.Parameter(
        torch.empty(nbytes, dtype=torch.uint8, device="meta"), requires_grad=False
    )
    return module


@attrs.frozen
class Use:
    """One model use seen by the engine.

    Attributes:
        time: ``time.perf_counter()`` once the model was resident.
        model_id: The model used.
        resident: Every model on the device right after, with the bytes of its weights there (a partly
            resident model's resident prefix, not its whole size).
    """

    time: float
    model_id: str
    resident: Mapping[str, int]


@attrs.frozen
class ReplayResult:
    """Totals of one replay.

    Attributes:
        strategy: The strategy's name.
        bytes_to_device: Host-to-device bytes.
        bytes_to_host: Device-to-host bytes (the evicted bytes when the rule copies victims back).
        evictions: Models taken off the device whole.
        peak_resident_bytes: The most bytes resident at once.
        shrinks: Victims kept down to a resident prefix, their tail taken off (none in a replay, whose models
            have one group; a run of ours has them: ``OffloadLog.total_shrinks``).
    """

    strategy: str
    bytes_to_device: int
    bytes_to_host: int
    evictions: int
    peak_resident_bytes: int
    shrinks: int = 0

    @property
    def left_device(self) -> int:
        """Models that left the device, whole or down to a prefix."""
        return self.evictions + self.shrinks


def _bytes_on_device(engine: OffloadEngine, model_id: str) -> int:
    """Bytes of ``model_id``'s weights on the device: all of them, or only its resident prefix when it is
    partly resident (shrunk to a prefix, or streaming its tail, whose groups come in only during its forward)."""
    part = engine._ledger.partial(model_id)  # (resident prefix, footprint) while partly resident
    return engine.nbytes(model_id) if part is None else part[0]


class UseRecorder:
    """Records an engine's plans and model uses while the ``with`` block runs.

    The engine tells its ``watchers`` of every plan and every use (the hooks' ``ensure_resident``
    before each forward); the recorder is one of them while the ``with`` block runs.

    Attributes:
        events: ``("plan", model ids)`` and ``("use", model id)`` in order: what ``replay`` takes.
        uses: Every use with the time and what was resident after it.
        sizes: Bytes of every model used.
    """

    def __init__(self, engine: OffloadEngine):
        self.engine = engine
        self.events: list[tuple[str, Any]] = []
        self.uses: list[Use] = []
        self.sizes: dict[str, int] = {}

    def __enter__(self) -> UseRecorder:
        self.engine.watchers.append(self._watch)
        return self

    def _watch(self, kind: str, value: Any) -> None:
        # Runs under the engine's lock, right after the plan was set or the model made resident.
        if kind == "plan":
            self.events.append(("plan", tuple(value)))
            return
        engine = self.engine
        self.sizes[value] = engine.nbytes(value)
        self.events.append(("use", value))
        resident = {m: _bytes_on_device(engine, m) for m in engine.resident_ids()}
        self.uses.append(Use(time.perf_counter(), value, resident))

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.engine.watchers.remove(self._watch)


def replay(
    events: Sequence[tuple[str, Any]],
    sizes: Mapping[str, int],
    budget: int,
    margin: int,
    strategy: object,
    copies_back: bool = False,
) -> ReplayResult:
    """Run recorded plans and uses through ``strategy`` on a ``SimulatedDevice`` of ``budget`` bytes.

    Args:
        events: ``("plan", ids)`` and ``("use", id)`` in order, as ``UseRecorder.events``.
        sizes: Bytes of every model used.
        budget: The device's bytes.
        margin: Bytes kept free (the engine's ``memory_reserve_margin``).
        strategy: The rule that picks victims (an ``OffloadStrategy``).
        copies_back: Count every evicted byte as copied back to the host, as a rule that moves
            victims with ``module.to("cpu")`` does (the peer's); ours keeps a host copy instead.

    Raises:
        KeyError: a use names a model missing from ``sizes``.
    """
    engine = OffloadEngine(SimulatedDevice(budget), memory_reserve_margin=margin, strategy=strategy)
    for model_id, nbytes in sizes.items():
        engine.attach(model_id, meta_module(nbytes))
    for kind, value in events:
        if kind == "plan":
            engine.set_plan([model_id for model_id in value if model_id in sizes])
        else:
            if value not in sizes:
                msg = f"replay: use of {value!r}, which sizes does not list (it lists {sorted(sizes)})."
                raise KeyError(msg)
            engine.ensure_resident(value)
    log = engine.log
    evicted = sum(sizes[m] for decision in log for m in decision.evicted)
    return ReplayResult(
        strategy=strategy_name(strategy),
        bytes_to_device=log.total_bytes_to_device,
        bytes_to_host=evicted if copies_back else log.total_bytes_to_host,
        evictions=log.total_evictions,
        peak_resident_bytes=engine.peak_resident_bytes,
        shrinks=log.total_shrinks,
    )
