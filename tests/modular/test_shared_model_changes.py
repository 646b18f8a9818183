"""A change of a shared model (LoRA, IP-Adapter, removal) from one thread waits for the call another pipeline
runs on it, and a call waits for a change in progress: each call sees the model all before or all after the
change, never a mix; without auto offload as with it."""

import threading
import time

import pytest
import torch
from diffusers.loaders import StableDiffusionLoraLoaderMixin

import blocks.stable_diffusion.tiny as sd_tiny
from modular import ComponentsManager
from offload import OffloadTimeoutError

from .tiny_sd import tiny_sd_pipeline

IP = {"subfolder": "models", "weight_name": "ip-adapter.safetensors"}
#: How long the running call pauses in its first UNet forward, for a change that does not wait to get in.
PAUSE = 0.5


@pytest.fixture(scope="module")
def ip_adapter(repo, tmp_path_factory):
    return sd_tiny.make_tiny_ip_adapter(tmp_path_factory.mktemp("ip") / "ip-adapter", repo)


def image_prompt():
    return torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))


def run(pipe, **inputs):
    """A seeded 3-step call at 32x32 pixels (not the tiny repo's default 64x64: a quarter of the work; what
    waits for what does not depend on the size)."""
    generator = torch.Generator().manual_seed(0)
    return pipe(
        prompt="a cat",
        num_inference_steps=3,
        height=32,
        width=32,
        generator=generator,
        output_type="pt",
        output="images",
        **inputs,
    )


def _lora(b, lora, ip):
    b.load_lora_weights(lora, adapter_name="x")


def _lora_disabled(b, lora, ip):
    _lora(b, lora, ip)
    b.disable_lora()


def _lora_fused(b, lora, ip):
    _lora(b, lora, ip)
    b.fuse_lora(lora_scale=0.5)


def _ip(b, lora, ip):
    b.load_ip_adapter(ip, **IP)


def _nothing(b, lora, ip):
    pass


#: (setup of pipeline B, the change B makes while A runs, whether A's call passes an image prompt)
CHANGES = {
    "load_lora_weights": (
        _nothing,
        lambda b, cm, lora, ip: b.load_lora_weights(lora, adapter_name="y"),
        False,
    ),
    "set_adapters": (_lora, lambda b, cm, lora, ip: b.set_adapters("x", 0.3), False),
    "disable_lora": (_lora, lambda b, cm, lora, ip: b.disable_lora(), False),
    "enable_lora": (_lora_disabled, lambda b, cm, lora, ip: b.enable_lora(), False),
    "fuse_lora": (_lora, lambda b, cm, lora, ip: b.fuse_lora(lora_scale=0.5), False),
    "unfuse_lora": (_lora_fused, lambda b, cm, lora, ip: b.unfuse_lora(), False),
    "delete_adapters": (_lora, lambda b, cm, lora, ip: b.delete_adapters("x"), False),
    "unload_lora_weights": (_lora, lambda b, cm, lora, ip: b.unload_lora_weights(), False),
    "load_ip_adapter": (_nothing, lambda b, cm, lora, ip: b.load_ip_adapter(ip, **IP), False),
    "set_ip_adapter_scale": (_ip, lambda b, cm, lora, ip: b.set_ip_adapter_scale(0.2), True),
    "unload_ip_adapter": (_ip, lambda b, cm, lora, ip: b.unload_ip_adapter(), True),
    "remove": (_nothing, lambda b, cm, lora, ip: cm.remove(cm.get_id(b.unet)), False),
    "unload_components": (_nothing, lambda b, cm, lora, ip: b.unload_components("unet"), False),
}


def pause_first_unet_forward(unet, thread_name, started):
    """In thread `thread_name`, the UNet's first forward says it started and pauses: a change that does not wait
    for the call lands between its steps."""

    def hook(module, args):
        if threading.current_thread().name == thread_name and not started.is_set():
            started.set()
            time.sleep(PAUSE)

    return unet.register_forward_pre_hook(hook)


@pytest.mark.parametrize("offload", [False, True], ids=["no_offload", "auto_offload"])
@pytest.mark.parametrize("name", list(CHANGES))
def test_a_change_from_another_pipeline_waits_for_the_running_call(repo, lora, ip_adapter, name, offload):
    """Pipeline B changes the UNet it shares with A while A's call runs: A's output equals its output before the
    change (no crash, no mix of steps), and B's change returns only after A's last UNet step."""
    setup, change, with_image = CHANGES[name]
    cm = ComponentsManager()
    a, b = tiny_sd_pipeline(repo, cm), tiny_sd_pipeline(repo, cm)
    assert a.unet is b.unet
    setup(b, lora, ip_adapter)
    inputs = {}
    if with_image:
        a.load_ip_adapter(ip_adapter, **IP)
        inputs = {"ip_adapter_image": image_prompt()}
    if offload:
        cm.enable_auto_cpu_offload(device="cpu", memory_reserve_margin=0)
    before = run(a, **inputs)
    started, done, results, errors = threading.Event(), {}, {}, []
    handle = pause_first_unet_forward(a.unet, "A", started)

    def last_forward(module, args, output):
        if threading.current_thread().name == "A":
            done["a"] = time.monotonic()

    recorder = a.unet.register_forward_hook(last_forward)

    def call_a():
        try:
            results["a"] = run(a, **inputs)
        except BaseException as error:  # surfaced below
            errors.append(error)

    def change_b():
        try:
            started.wait(10)
            change(b, cm, lora, ip_adapter)
            done["b"] = time.monotonic()
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=call_a, name="A"), threading.Thread(target=change_b, name="B")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    handle.remove()
    recorder.remove()
    assert errors == []
    assert torch.equal(results["a"], before)
    assert done["a"] < done["b"]  # A's last UNet step ran before B's change returned


def fuse_halfway_in_a_thread(pipe, lora, monkeypatch) -> threading.Thread:
    """Start ``pipe.fuse_lora`` in a thread that fuses the UNet, pauses, then fuses the text encoder; return once
    the UNet is fused (the thread, to join, still has the text encoder to do)."""
    pipe.load_lora_weights(lora, adapter_name="x")
    fuse, halfway = StableDiffusionLoraLoaderMixin.fuse_lora, threading.Event()

    def fuse_in_two_halves(self, components, **options):
        fuse(self, components=["unet"], **options)
        halfway.set()
        time.sleep(PAUSE)
        fuse(self, components=["text_encoder"], **options)

    monkeypatch.setattr(StableDiffusionLoraLoaderMixin, "fuse_lora", fuse_in_two_halves)
    changer = threading.Thread(target=pipe.fuse_lora, kwargs={"lora_scale": 0.5})
    changer.start()
    assert halfway.wait(10)
    return changer


def test_a_call_started_during_a_change_waits_for_all_of_it(repo, lora, monkeypatch):
    """A call that starts while B's fuse_lora has fused the UNet but not yet the text encoder runs once both are
    fused: its output equals a call after the change, never the half-fused mix."""
    cm = ComponentsManager()
    a, b = tiny_sd_pipeline(repo, cm), tiny_sd_pipeline(repo, cm)
    changer = fuse_halfway_in_a_thread(b, lora, monkeypatch)
    during = run(a)
    changer.join()
    after = run(a)
    assert torch.equal(during, after)


def test_a_change_waits_at_most_wait_timeout_and_changes_nothing(repo, lora):
    """With cm.wait_timeout = 0.1, fuse_lora on B while A's call runs gives up with OffloadTimeoutError naming
    what waited; nothing is fused, and A's call finishes with its usual output."""
    cm = ComponentsManager()
    a, b = tiny_sd_pipeline(repo, cm), tiny_sd_pipeline(repo, cm)
    b.load_lora_weights(lora, adapter_name="x")
    before = run(a)
    cm.wait_timeout = 0.1
    started, results = threading.Event(), {}
    handle = pause_first_unet_forward(a.unet, "A", started)
    caller = threading.Thread(target=lambda: results.setdefault("a", run(a)), name="A")
    caller.start()
    started.wait(10)
    with pytest.raises(OffloadTimeoutError) as refused:
        b.fuse_lora()
    caller.join()
    handle.remove()
    assert str(refused.value) == (
        "fuse_lora() waited 0.1 s for the running calls of 2 of its models in other threads to finish; nothing "
        "was changed. Let those calls finish first, or raise wait_timeout (components_manager.wait_timeout = ...)."
    )
    assert cm.get_model_info(cm.get_id(b.unet), "lora")["lora"][0]["fused"] is False
    assert torch.equal(results["a"], before)


def test_a_change_from_inside_a_call_on_the_same_model_is_refused(repo, lora):
    """A LoRA call made from inside a call running on the same UNet (here: its forward hook) raises
    RuntimeError at once instead of waiting for itself."""
    cm = ComponentsManager()
    a, b = tiny_sd_pipeline(repo, cm), tiny_sd_pipeline(repo, cm)
    raised = []

    def hook(module, args):
        if not raised:
            with pytest.raises(
                RuntimeError, match="called from inside a pipeline call running on the same model"
            ):
                b.load_lora_weights(lora, adapter_name="x")
            raised.append(True)

    handle = a.unet.register_forward_pre_hook(hook)
    run(a)
    handle.remove()
    assert raised == [True] and b.get_list_adapters() == {}


def test_a_save_started_during_a_change_writes_all_of_it(repo, lora, monkeypatch, tmp_path):
    """save_pretrained started while B's fuse_lora has fused only the UNet waits for the text encoder too: the
    saved folder loads back to the fully fused outputs."""
    cm = ComponentsManager()
    a, b = tiny_sd_pipeline(repo, cm), tiny_sd_pipeline(repo, cm)
    changer = fuse_halfway_in_a_thread(b, lora, monkeypatch)
    a.save_pretrained(tmp_path / "saved")
    changer.join()
    assert torch.equal(run(tiny_sd_pipeline(tmp_path / "saved", ComponentsManager())), run(a))
