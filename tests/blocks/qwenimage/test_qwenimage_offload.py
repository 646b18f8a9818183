"""Qwen-Image under the components manager's auto offload: the plan in order of use, and unchanged outputs."""

import torch

from modular import ComponentsManager
from offload import SimulatedDevice, module_nbytes

from .conftest import QWEN_IMAGE, SIZE, load_edit_pipeline, make_image


def _run(pipe, **extra):
    size = {} if "image" in extra else {"height": SIZE, "width": SIZE}
    return pipe(
        prompt="a cat",
        negative_prompt="blurry",
        num_inference_steps=2,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="np",
        output="images",
        **size,
        **extra,
    )


def _pipelines(repo, edit_repo, cm):
    """Our text-to-image and edit pipelines on one manager (the edit repo's models are other objects)."""
    pipe = QWEN_IMAGE.blocks_class().init_pipeline(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe, load_edit_pipeline(edit_repo, components_manager=cm)


def test_the_plan_lists_models_in_order_of_use(qwen_repo, qwen_edit_repo, monkeypatch, small_edit_area):
    """Text-to-image uses text encoder, transformer, VAE; edit encodes the image with the VAE before denoising."""
    cm = ComponentsManager()
    pipe, edit = _pipelines(qwen_repo, qwen_edit_repo, cm)
    seen = []
    monkeypatch.setattr(cm, "set_execution_plan", lambda objs: seen.append(list(objs)))
    _run(pipe)
    _run(edit, image=make_image())
    assert seen[0] == [pipe.text_encoder, pipe.transformer, pipe.vae]
    assert seen[1] == [edit.text_encoder, edit.vae, edit.transformer, edit.vae]


def test_offloaded_runs_equal_plain_runs(qwen_repo, qwen_edit_repo, small_edit_area):
    """With a device budget that forces evictions, both workflows give bit-equal outputs."""
    cm = ComponentsManager()
    pipe, edit = _pipelines(qwen_repo, qwen_edit_repo, cm)
    expected = [_run(pipe), _run(edit, image=make_image())]
    # Room for the largest model and a little: every switch to another model evicts.
    budget = max(module_nbytes(m) for m in (pipe.transformer, pipe.vae, pipe.text_encoder)) + 1024
    cm.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    try:
        assert _run(pipe).tobytes() == expected[0].tobytes()
        assert _run(edit, image=make_image()).tobytes() == expected[1].tobytes()
        assert any(entry.evicted for entry in cm.offload_log)
    finally:
        cm.disable_auto_cpu_offload()
