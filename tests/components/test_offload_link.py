"""The manager's offload link: what it asks of the engine (a recording stand-in, and one real run)."""

import pytest
import torch
from diffusers import PNDMScheduler

import offload
from components import ComponentsManager
from components.offload_link import OffloadLink
from components.table import device_cell


class RecordingEngine:
    """Stands in for offload.OffloadEngine and records the manager's calls."""

    instances = []

    def __init__(
        self,
        device=None,
        memory_reserve_margin="3GB",
        strategy=None,
        wait_timeout=600.0,
        host_budget=None,
        spill_folder=None,
    ):
        self.args = (device, memory_reserve_margin, strategy)
        self.host_args = (host_budget, spill_folder)
        self.wait_timeout = wait_timeout
        self.calls = []
        self.log = "the log"
        self.execution_device = torch.device("cuda:0")
        RecordingEngine.instances.append(self)

    def check_fit(self, modules, after="", weight_files=None, pinned=()):
        self.checked = list(modules)

    def attach(self, model_id, module, weight_files=(), pinned=False):
        self.calls.append(("attach", model_id))

    def detach(self, model_id, read_back=True):
        self.calls.append(("detach", model_id))

    def close(self):
        self.calls.append(("close",))

    def set_strategy(self, strategy):
        self.calls.append(("set_strategy", strategy))
        self.args = (*self.args[:2], strategy)

    @property
    def strategy(self):
        return self.args[2]

    def set_plan(self, ids):
        self.calls.append(("set_plan", list(ids)))

    def has_hook(self, model_id):
        return True

    def residency(self, model_id):
        return offload.Residency(
            attached=True, resident=False, device="cuda:0", execution_device=self.execution_device
        )

    def refresh_host_copy(self, model_id):
        self.calls.append(("refresh", model_id))


@pytest.fixture
def fake_engine(monkeypatch):
    RecordingEngine.instances = []
    monkeypatch.setattr(offload, "OffloadEngine", RecordingEngine)
    return RecordingEngine


def test_enable_attaches_models_only(fake_engine):
    """enable_auto_cpu_offload builds the engine with the arguments and attaches every nn.Module."""
    cm = ComponentsManager()
    unet_id = cm.add("unet", torch.nn.Linear(2, 2))
    cm.add("scheduler", PNDMScheduler())
    cm.enable_auto_cpu_offload(
        device="cuda:0", memory_reserve_margin="1GB", offload_strategy="s", wait_timeout=5
    )
    engine = fake_engine.instances[0]
    assert engine.args == ("cuda:0", "1GB", "s") and engine.wait_timeout == 5
    assert engine.checked == [unet_id]
    assert engine.calls == [("attach", unet_id)]
    assert cm.auto_offload_enabled and cm.offload_engine is engine


def test_add_and_remove_attach_and_detach(fake_engine):
    """Under offload, add() attaches a new model and remove() detaches it; nothing else is touched."""
    cm = ComponentsManager()
    cm.enable_auto_cpu_offload()
    engine = fake_engine.instances[0]
    vae_id = cm.add("vae", torch.nn.Linear(2, 2))
    cm.add("vae", cm.get_one(vae_id))
    tokenizer_id = cm.add("tokenizer", object())
    cm.remove(tokenizer_id)
    cm.remove(vae_id)
    assert engine.calls == [("attach", vae_id), ("detach", vae_id)]


def test_table_and_info_use_the_engine(fake_engine):
    """The device cell and hook fields come from the engine when offload is on."""
    cm = ComponentsManager()
    unet_id = cm.add("unet", torch.nn.Linear(2, 2))
    cm.enable_auto_cpu_offload()
    assert f"{unet_id} | Linear | cpu(cuda:0)" in cm.table()
    assert cm.get_model_info(unet_id, ["has_hook", "execution_device"]) == {
        "has_hook": True,
        "execution_device": torch.device("cuda:0"),
    }


def test_plan_strategy_log_refresh_and_disable(fake_engine):
    """set_execution_plan maps objects to ids (registered models only); the rest delegates; disable closes."""
    cm = ComponentsManager()
    unet, vae = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    unet_id, vae_id = cm.add("unet", unet), cm.add("vae", vae)
    cm.set_execution_plan([unet, vae])  # off: a no-op
    cm.enable_auto_cpu_offload()
    engine = fake_engine.instances[0]
    cm.set_execution_plan([unet, PNDMScheduler(), unet, torch.nn.Linear(1, 1), vae])
    cm.set_offload_strategy("lru")
    cm.refresh_host_copy(unet_id)
    assert cm.offload_log == "the log"
    cm.disable_auto_cpu_offload()
    assert engine.calls[2:] == [
        ("set_plan", [unet_id, unet_id, vae_id]),
        ("set_strategy", "lru"),
        ("refresh", unet_id),
        ("close",),
    ]
    assert not cm.auto_offload_enabled and cm.offload_log is None


def test_enable_again_replaces_the_engine(fake_engine):
    """A second enable closes the first engine and attaches to the new one."""
    cm = ComponentsManager()
    unet_id = cm.add("unet", torch.nn.Linear(2, 2))
    cm.enable_auto_cpu_offload(memory_reserve_margin="1GB")
    cm.enable_auto_cpu_offload(memory_reserve_margin="2GB")
    first, second = fake_engine.instances
    assert first.calls[-1] == ("close",)
    assert second.calls == [("attach", unet_id)]
    assert cm.offload_engine is second


def test_strategy_needs_offload_on():
    """set_offload_strategy with offload off says to enable it first."""
    with pytest.raises(ValueError, match="set_offload_strategy\\(\\) needs auto offload, which is off"):
        ComponentsManager().set_offload_strategy(object())


def test_real_engine_on_a_simulated_device():
    """With the real engine on a simulated device, a model runs and the table shows the engine's cell."""
    cm = ComponentsManager()
    model = torch.nn.Linear(4, 4)
    model_id = cm.add("unet", model)
    cm.enable_auto_cpu_offload(device=offload.SimulatedDevice("1MB"), memory_reserve_margin=0)
    model(torch.ones(1, 4))
    assert device_cell(cm.offload_engine.residency(model_id)) in cm.table()
    assert cm.get_model_info(model_id, "has_hook") == {"has_hook": True}
    cm.remove(model_id)
    assert not cm.offload_engine.has_hook(model_id)
    cm.disable_auto_cpu_offload()


# ---- the link itself --------------------------------------------------------------------------------------------


def _sim_link(budget="1MB", **components):
    link = OffloadLink()
    link.enable(components, offload.SimulatedDevice(budget), 0, None, 600.0)
    return link


def test_link_off_does_nothing():
    """An off link holds no engine, ignores attach/detach/plans/refresh and reports no facts."""
    link = OffloadLink()
    model = torch.nn.Linear(2, 2)
    link.attach("m", model)
    link.set_plan(["m"])
    link.refresh("m", model)
    link.detach("m", model)
    assert (link.engine, link.enabled, link.log, link.residency("m"), link.places("m")) == (
        None,
        False,
        None,
        None,
        False,
    )
    assert repr(link) == "OffloadLink(engine=None)"


def test_link_enable_attaches_models_only():
    """enable() builds a typed engine and attaches every nn.Module it is given, skipping other objects."""
    model = torch.nn.Linear(2, 2)
    link = _sim_link(unet_1=model, scheduler_2=PNDMScheduler())
    assert isinstance(link.engine, offload.OffloadEngine) and link.enabled
    assert link.engine.attached_ids() == ["unet_1"]
    assert link.places("unet_1") and not link.places("scheduler_2")
    assert link.log is link.engine.log
    link.disable()


def test_link_attach_detach_and_plan():
    """attach/detach hand models to the engine and take them back; set_plan passes the ids on."""
    link = _sim_link()
    model = torch.nn.Linear(2, 2)
    link.attach("vae_1", model)
    link.attach("tokenizer_2", object())  # not a model: ignored
    engine = link.engine
    assert engine is not None and engine.attached_ids() == ["vae_1"]
    link.set_plan(["vae_1", "vae_1"])
    assert engine._plan.model_ids == ("vae_1", "vae_1")
    link.detach("vae_1", model)
    assert engine.attached_ids() == [] and not link.places("vae_1")
    link.disable()
    assert link.engine is None


def test_link_reports_residency_facts():
    """residency() is the engine's facts: off the device before the first call, on it after."""
    model = torch.nn.Linear(4, 4)
    link = _sim_link(unet_1=model)
    assert link.residency("unet_1") == offload.Residency(
        attached=True, resident=False, device="sim", execution_device=torch.device("cpu")
    )
    model(torch.ones(1, 4))
    assert link.residency("unet_1").resident
    link.disable()


def test_link_set_strategy_needs_an_engine():
    """set_strategy() on an off link is a ValueError naming the caller and the fix."""
    with pytest.raises(ValueError) as info:
        OffloadLink().set_strategy(offload.LRUStrategy(), "set_offload_strategy()")
    assert str(info.value) == (
        "set_offload_strategy() needs auto offload, which is off. Call enable_auto_cpu_offload(...) first."
    )


def test_link_enable_that_does_not_fit_keeps_the_previous_engine():
    """A model too large for the new engine leaves the link on its previous engine, attached as before."""
    model = torch.nn.Linear(100, 100)  # 40 kB of weights and bias
    link = _sim_link("1MB", unet_1=model)
    first = link.engine
    with pytest.raises(
        offload.ModelTooLargeError, match="Auto offload was left on with the previous settings"
    ):
        link.enable({"unet_1": model}, offload.SimulatedDevice("1kB"), 0, None, 600.0)
    assert link.engine is first and first.attached_ids() == ["unet_1"]
    link.disable()


def test_manager_holds_one_typed_link():
    """The manager's offload API goes through its one OffloadLink member; is_auto_offloaded asks it."""
    cm = ComponentsManager()
    model = torch.nn.Linear(2, 2)
    model_id = cm.add("unet", model)
    assert isinstance(cm._offload, OffloadLink) and not cm.is_auto_offloaded(model)
    cm.enable_auto_cpu_offload(device=offload.SimulatedDevice("1MB"), memory_reserve_margin=0)
    assert cm.offload_engine is cm._offload.engine and cm.offload_log is cm._offload.log
    assert cm.is_auto_offloaded(model) and not cm.is_auto_offloaded(torch.nn.Linear(2, 2))
    cm.remove(model_id)
    assert not cm.is_auto_offloaded(model)
    cm.disable_auto_cpu_offload()
    assert cm.offload_engine is None


def test_memory_reserve_is_the_peers_newest_name_for_the_margin():
    """`enable_auto_cpu_offload(memory_reserve="3KiB")` (diffusers' main after 0.42.1) sets the margin, as
    `memory_reserve_margin` does; both at once is a TypeError that leaves offload off."""
    from offload import SimulatedDevice

    cm = ComponentsManager()
    cm.add("m", torch.nn.Linear(4, 4))
    cm.enable_auto_cpu_offload(SimulatedDevice("1MB"), memory_reserve="3KiB")
    assert cm.offload_engine.memory_reserve_margin == 3 * 1024
    cm.disable_auto_cpu_offload()
    with pytest.raises(TypeError, match="memory_reserve and memory_reserve_margin are one setting"):
        cm.enable_auto_cpu_offload(SimulatedDevice("1MB"), memory_reserve_margin="1KB", memory_reserve="3KiB")
    assert cm.offload_engine is None
