"""The engine's error messages: what failed, the sizes that decided it (printed so they differ), the fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from offload.devices.probes import MemoryProbe
from offload.devices.units import format_bytes, format_bytes_distinct

__all__ = [
    "busy_timeout",
    "device_name",
    "forward_oom",
    "needs_own_running",
    "reload_hint",
    "too_large",
    "unfit",
    "wait_for_cycle",
    "wait_timeout",
]

_FIX_SIZE = (
    "Use a larger device, a smaller memory_reserve_margin, or load the model in a smaller dtype or quantized."
)


def device_name(probe: MemoryProbe) -> str:
    """``"sim (budget 1000 B)"``, ``"cuda:0 (total 79.11 GiB)"`` or the bare name: what the probe describes."""
    return probe.describe()


def _listing(sizes: Mapping[str, str]) -> str:
    items = [f"{model_id!r} ({size})" for model_id, size in sizes.items()]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" and {items[-1]}"


def too_large(model_id: str, nbytes: int, capacity: int, device: str, margin: int) -> str:
    """A model that cannot fit even with every other model evicted."""
    need, most = format_bytes_distinct(nbytes, max(capacity, 0))
    return (
        f"model {model_id!r} needs {need} but at most {most} can be made free on {device} with every other "
        f"model evicted (memory_reserve_margin {format_bytes(margin)}). {_FIX_SIZE}"
    )


def unfit(
    sizes: Mapping[str, int],
    capacity: int,
    device: str,
    margin: int,
    intro: str = "{models} cannot fit",
    after: str = "",
) -> str:
    """Models that cannot fit even alone, found before anything moved (at enable or plan time).

    ``intro`` begins the message; ``{models}`` in it becomes ``model 'a' (1200 B)`` or ``models 'a' (..) and 'b' (..)``.
    """
    texts = format_bytes_distinct(max(capacity, 0), *sizes.values())
    noun = "model" if len(sizes) == 1 else "models"
    models = f"{noun} {_listing(dict(zip(sizes, texts[1:])))}"
    return (
        f"{intro.format(models=models)} on {device} even alone: at most {texts[0]} can be made free for one "
        f"model (memory_reserve_margin {format_bytes(margin)}). "
        f"{_FIX_SIZE.replace('the model', f'the {noun}')}{after}"
    )


def needs_own_running(
    model_id: str, nbytes: int, reachable: int, mine: Mapping[str, int], device: str
) -> str:
    """The room a model needs is held by models running in the asking thread itself (a nested call)."""
    need, most, *held = format_bytes_distinct(nbytes, max(reachable, 0), *mine.values())
    return (
        f"model {model_id!r} needs {need} but at most {most} can be made free on {device} without evicting "
        f"{_listing(dict(zip(mine, held)))}, running in this thread now: a model called from inside another "
        "model's forward cannot evict it, and waiting would never end. Use a larger device or a smaller "
        "memory_reserve_margin, or give models that call each other room on the device together."
    )


def wait_for_cycle(
    model_id: str,
    nbytes: int,
    device: str,
    mine: Mapping[str, int],
    others: Sequence[tuple[str, Mapping[str, int], str, int]],
) -> str:
    """Every thread holding the room waits for room itself. ``others``: (thread name, its running models
    with sizes, the model it waits for, that model's size)."""
    held = "; ".join(
        f"thread {name!r} runs {_listing({m: format_bytes(s) for m, s in models.items()})} and waits for "
        f"{wanted!r} ({format_bytes(size)})"
        for name, models, wanted, size in others
    )
    mine_text = _listing({m: format_bytes(s) for m, s in mine.items()})
    return (
        f"model {model_id!r} ({format_bytes(nbytes)}) cannot be placed on {device}: the room it needs is held "
        f"by models running in other threads, each of which waits for room this thread holds ({held}; this "
        f"thread runs {mine_text}). No waiting can end this cycle, so this call stops and the others go on. "
        "Use a larger device, or do not call hooked models from inside other models' forwards in several "
        "threads at once."
    )


def wait_timeout(
    model_id: str,
    nbytes: int,
    timeout: float,
    device: str,
    blockers: Sequence[tuple[str, str, int]],
    room: int,
) -> str:
    """A call waited ``timeout`` seconds for room. ``blockers``: (model id, thread name, size) running now."""
    need, *sizes = format_bytes_distinct(nbytes, max(room, 0), *(size for _, _, size in blockers))
    running = ", ".join(
        f"{blocker!r} ({size}) in thread {thread!r}"
        for (blocker, thread, _), size in zip(blockers, sizes[1:])
    )
    return (
        f"model {model_id!r} ({need}) waited {timeout:g} s for room on {device} and gave up: still running "
        f"in other threads: {running or 'nothing'} (at most {sizes[0]} can be made free without them). "
        "Raise wait_timeout (enable_auto_cpu_offload(..., wait_timeout=...)), run fewer calls at once, or use "
        "a larger device."
    )


def busy_timeout(what: str, timeout: float, busy: Sequence[str]) -> str:
    """``close()`` or ``detach()`` waited ``timeout`` seconds for calls in other threads to finish."""
    return (
        f"{what} waited {timeout:g} s for the calls of {list(busy)!r} in other threads to finish; nothing was "
        "detached. Let those calls finish first, or raise wait_timeout."
    )


def forward_oom(model_id: str, nbytes: int, device: str, free: int, margin: int, retried: bool = True) -> str:
    """A forward ran out of memory twice (once, then again after every other model was evicted), or once with
    the retry turned off (``retry_on_oom=False``)."""
    again = (
        "and again after every other model was evicted"
        if retried
        else "and retry_on_oom=False leaves the retry to you"
    )
    return (
        f"model {model_id!r} ({format_bytes(nbytes)}) ran out of memory on {device} in its forward, {again} "
        f"({format_bytes(free)} free after memory_reserve_margin "
        f"{format_bytes(margin)}). Use smaller inputs (batch, resolution), a larger memory_reserve_margin, or a "
        "larger device."
    )


def reload_hint(quantized: bool) -> str:
    """The second fix a host-budget refusal offers: a file to read the weights back from, which a quantized
    model cannot have (its file holds the unquantized weights: ``FileGaps.quantized``)."""
    if quantized:
        return "or hold it unquantized, or pin it (offload.pin) so that it stays where it is"
    return "or save the model with save_pretrained() and load it from there"
