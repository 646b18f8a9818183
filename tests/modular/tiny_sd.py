"""The tiny Stable Diffusion pipeline the modular tests run: loaded in float32 onto a manager, no progress bar."""

import torch

from modular import ComponentsManager, ModularPipeline


def tiny_sd_pipeline(repo, cm: ComponentsManager) -> ModularPipeline:
    """The pipeline of the tiny repo `repo`, its components loaded in float32 and registered with `cm`."""
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_sd_images(pipe: ModularPipeline, steps: int = 2) -> torch.Tensor:
    """The images of one seeded call ("a cat", seed 0, ``steps`` steps) as a tensor."""
    generator = torch.Generator().manual_seed(0)
    return pipe(
        prompt="a cat", num_inference_steps=steps, generator=generator, output_type="pt", output="images"
    )


def tiny_sd_latents(pipe: ModularPipeline, seed: int = 0) -> torch.Tensor:
    """The latents of one seeded call ("a cat", 2 steps, ``output_type="latent"``), no progress bar."""
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(seed)
    return pipe(
        prompt="a cat", num_inference_steps=2, generator=generator, output_type="latent", output="images"
    )
