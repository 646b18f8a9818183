"""The manager's look-ups and offload switch do not grow (or grow linearly) with the models it holds.

Counted in lines run (``tests.offload.helpers.lines_run``), never timed; ``benchmarks/manager_scale.py`` times
the same operations beside the peer.
"""

import gc

import pytest
import torch

from components import ComponentNotFoundError, ComponentsManager
from offload import SimulatedDevice
from tests.offload.helpers import lines_run, sized

SIZE = 64


def manager_of(count: int) -> tuple[ComponentsManager, list[str]]:
    cm = ComponentsManager()
    ids = [cm.add(f"m{index}", sized(SIZE)) for index in range(count)]
    return cm, ids


def test_get_one_by_id_add_and_get_id_run_the_same_lines_beside_10_or_300_components():
    """An id is one dict read; an object's id comes from an index, so adding one does not scan the others."""
    counts = []
    for count in (10, 300):
        cm, ids = manager_of(count)
        extra = sized(SIZE)
        get = lines_run(cm.get_one, component_id=ids[3])
        add = lines_run(cm.add, "extra", extra)
        find = lines_run(cm.get_id, extra)
        counts.append((get, add, find))
    assert counts[0] == counts[1]


def test_enable_and_disable_run_lines_linear_in_the_models():
    """Attaching each model costs the same whatever is attached already: 10 more models, the same lines more."""
    lines = {}
    for count in (
        1,
        10,
        20,
        30,
    ):  # the first installs what every engine shares (offload.weights.changes), once
        cm, _ = manager_of(count)
        enable = lines_run(cm.enable_auto_cpu_offload, SimulatedDevice(4 * SIZE), memory_reserve_margin=0)
        disable = lines_run(cm.disable_auto_cpu_offload)
        lines[count] = (enable, disable)
    for which in (0, 1):
        assert lines[30][which] - lines[20][which] == lines[20][which] - lines[10][which]


def test_get_one_by_id_answers_as_before():
    """The fast path returns the object; a missing id and an id beside other filters raise as ever."""
    cm, ids = manager_of(2)
    assert cm.get_one(component_id=ids[1]) is cm.components[ids[1]]
    with pytest.raises(ComponentNotFoundError, match=r"No component has id 'nope'\. Registered components"):
        cm.get_one(component_id="nope")
    with pytest.raises(ValueError, match="pass either component_id or name"):
        cm.get_one(component_id=ids[0], name="m0")


def test_a_registration_whose_owner_is_gone_is_not_returned_by_id():
    """A registration queued for release (its owner collected) is dropped before a look-up by id answers."""

    class Owner:
        pass

    cm = ComponentsManager()
    owner = Owner()
    component_id = cm.add("tmp", torch.nn.Linear(2, 2), owner=owner)
    del owner
    gc.collect()
    with pytest.raises(ComponentNotFoundError):
        cm.get_one(component_id=component_id)
    assert component_id not in cm


def test_the_object_index_follows_adds_removes_and_collections():
    """After adds, removals and collection replacements, each object's id is what a scan of the registry finds."""
    cm = ComponentsManager()
    models = [sized(SIZE) for _ in range(4)]
    first = cm.add("unet", models[0], collection="a")
    cm.add("unet", models[1], collection="a")  # replaces the first in "a": it leaves the manager
    cm.add("vae", models[2])
    cm.remove(cm.get_id(models[2]))
    cm.add("vae", models[2])
    assert cm.get_id(models[0]) is None and first not in cm
    for model in models:
        found = next((cid for cid, obj in cm.components.items() if obj is model), None)
        assert cm.get_id(model) == found
