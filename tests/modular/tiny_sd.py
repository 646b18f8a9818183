"""The tiny Stable Diffusion pipeline the modular tests run: loaded in float32 onto a manager, no progress bar."""

import torch

from modular import ComponentsManager, ModularPipeline


def tiny_sd_pipeline(repo, cm: ComponentsManager) -> ModularPipeline:
    """The pipeline of the tiny repo `repo`, its components loaded in float32 and registered with `cm`."""
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe
