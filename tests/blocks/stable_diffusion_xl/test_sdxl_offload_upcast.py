"""SDXL's float16 VAE upcast (force_upcast) under auto offload: the conversions go through the engine."""

import pytest
import torch

from modular import ComponentsManager, ModularPipeline
from offload import SimulatedDevice, module_nbytes

from ..helpers import STEPS, assert_identical, make_image, seeded


@pytest.mark.parametrize("workflow", ["text2image", "image2image"])
def test_float16_vae_upcast_under_auto_offload_equals_the_run_without(sdxl_repo, workflow):
    """With a float16 VAE under auto offload, encoding and decoding upcast it through the engine: the images
    equal the run without offload, the VAE ends float16, and the engine counts its float16 bytes."""
    cm = ComponentsManager()
    pipe = ModularPipeline.from_pretrained(sdxl_repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    pipe.vae.to(torch.float16)
    assert pipe.vae.config.force_upcast
    extra = {"image": make_image(), "strength": 1.0} if workflow == "image2image" else {}
    kwargs = {"prompt": "a cat", "num_inference_steps": STEPS, "output_type": "np", **extra}
    expected = pipe(generator=seeded(0), output="images", **kwargs)
    cm.enable_auto_cpu_offload(device=SimulatedDevice("1GB"), memory_reserve_margin=0)
    got = pipe(generator=seeded(0), output="images", **kwargs)
    assert_identical(got, expected)
    assert pipe.vae.dtype == torch.float16
    assert cm.offload_engine.nbytes(cm.get_id(pipe.vae)) == module_nbytes(pipe.vae)
    assert any(entry.reason == "refresh" for entry in cm.offload_log)  # the upcast went through the engine
