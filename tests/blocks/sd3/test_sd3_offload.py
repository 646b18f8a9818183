"""SD3 under the components manager's auto offload: the plan in order of use, and unchanged outputs."""

import torch

from modular import ComponentsManager, ModularPipeline
from offload import SimulatedDevice, module_nbytes

from .conftest import make_image, make_mask


def _pipeline(repo, cm):
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _run(pipe, **extra):
    return pipe(
        prompt="a cat",
        num_inference_steps=3,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="np",
        output="images",
        **extra,
    )


WORKFLOW_INPUTS = [{}, {"image": make_image()}, {"image": make_image(), "mask_image": make_mask()}]


def test_the_plan_lists_models_in_order_of_use(sd3_repo, monkeypatch):
    """Text-to-image uses the CLIP encoders, transformer, VAE; image-to-image and inpainting encode with the VAE
    first (inpainting twice: the image, then the masked image after the noise). T5, which a repo may lack, is not
    in the plan: offload places it when it runs."""
    cm = ComponentsManager()
    pipe = _pipeline(sd3_repo, cm)
    seen = []
    monkeypatch.setattr(cm, "set_execution_plan", lambda objs: seen.append(list(objs)))
    for inputs in WORKFLOW_INPUTS:
        _run(pipe, **inputs)
    encoders = [pipe.text_encoder, pipe.text_encoder_2]
    assert seen[0] == [*encoders, pipe.transformer, pipe.vae]
    assert seen[1] == [*encoders, pipe.vae, pipe.transformer, pipe.vae]
    assert seen[2] == [*encoders, pipe.vae, pipe.transformer, pipe.vae]


def test_offloaded_runs_equal_plain_runs(sd3_repo):
    """With a device budget that forces evictions, every workflow gives bit-equal outputs."""
    cm = ComponentsManager()
    pipe = _pipeline(sd3_repo, cm)
    expected = [_run(pipe, **inputs) for inputs in WORKFLOW_INPUTS]
    models = (pipe.transformer, pipe.vae, pipe.text_encoder, pipe.text_encoder_2, pipe.text_encoder_3)
    # Room for the largest model and a little: every switch to another model evicts.
    budget = max(module_nbytes(m) for m in models) + 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    try:
        for inputs, images in zip(WORKFLOW_INPUTS, expected, strict=True):
            assert _run(pipe, **inputs).tobytes() == images.tobytes()
        assert any(entry.evicted for entry in cm.offload_log)
    finally:
        cm.disable_auto_cpu_offload()
