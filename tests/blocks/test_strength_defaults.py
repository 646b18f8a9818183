"""Each family declares the classic pipelines' strength defaults per workflow, so ``doc`` shows them."""

import inspect

import diffusers
import pytest

from blocks.flux import FluxAutoBlocks
from blocks.sd3 import StableDiffusion3AutoBlocks
from blocks.stable_diffusion import StableDiffusionAutoBlocks
from blocks.stable_diffusion_xl import StableDiffusionXLAutoBlocks, StableDiffusionXLRefinerBlocks
from modular import ModularPipelineBlocks

# (blocks, workflow, the classic pipeline whose strength default that workflow reproduces)
WORKFLOWS = [
    (StableDiffusionAutoBlocks, "image2image", "StableDiffusionImg2ImgPipeline"),
    (StableDiffusionAutoBlocks, "inpainting", "StableDiffusionInpaintPipeline"),
    (StableDiffusionXLAutoBlocks, "image2image", "StableDiffusionXLImg2ImgPipeline"),
    (StableDiffusionXLAutoBlocks, "inpainting", "StableDiffusionXLInpaintPipeline"),
    (FluxAutoBlocks, "image2image", "FluxImg2ImgPipeline"),
    (StableDiffusion3AutoBlocks, "image2image", "StableDiffusion3Img2ImgPipeline"),
    (StableDiffusion3AutoBlocks, "inpainting", "StableDiffusion3InpaintPipeline"),
]


def classic_strength(pipeline_name: str) -> float:
    """The strength default in the classic pipeline's signature."""
    return inspect.signature(getattr(diffusers, pipeline_name).__call__).parameters["strength"].default


def strength_declarations(block: ModularPipelineBlocks, path: str = "") -> dict[str, object]:
    """Every leaf under `block` that reads strength, by path, with the default it declares."""
    if not block.sub_blocks:
        defaults = [p.default for p in block.inputs if p.name == "strength"]
        return {path: defaults[0]} if defaults else {}
    found: dict[str, object] = {}
    for name, child in block.sub_blocks.items():
        found.update(strength_declarations(child, f"{path}.{name}" if path else name))
    return found


@pytest.mark.parametrize(("blocks_class", "workflow", "classic"), WORKFLOWS)
def test_every_leaf_declares_the_classic_default(blocks_class, workflow, classic):
    """Every block of a workflow that reads strength declares the classic pipeline's default."""
    declared = strength_declarations(blocks_class().get_workflow(workflow))
    assert declared, f"no block of {workflow} reads strength"
    assert declared == dict.fromkeys(declared, classic_strength(classic))


def test_refiner_declares_image_to_image_default():
    """The SDXL refiner is image-to-image: its blocks declare StableDiffusionXLImg2ImgPipeline's 0.3."""
    declared = strength_declarations(StableDiffusionXLRefinerBlocks())
    assert set(declared.values()) == {classic_strength("StableDiffusionXLImg2ImgPipeline")}


@pytest.mark.parametrize(
    ("blocks_class", "line"),
    [
        (
            StableDiffusionXLAutoBlocks,
            "strength (float, default by branch: 0.9999 (check_inputs.inpaint_check_inputs), 0.3 (check_inputs.img2img_check_inputs))",
        ),
        (
            StableDiffusionAutoBlocks,
            "strength (float, default by branch: 1.0 (check_inputs.inpaint_check_inputs), 0.8 (check_inputs.img2img_check_inputs))",
        ),
        (FluxAutoBlocks, "strength (float, default: 0.6)"),
    ],
)
def test_doc_shows_the_defaults(blocks_class, line):
    """The auto blocks' doc names each workflow's strength default."""
    [shown] = [
        text.strip() for text in blocks_class().doc.splitlines() if text.strip().startswith("strength (")
    ]
    assert shown.startswith(line + ":")


def test_composed_input_records_defaults_by_block():
    """The SDXL auto blocks' strength has no single default and records inpainting's and image-to-image's."""
    [strength] = [p for p in StableDiffusionXLAutoBlocks().inputs if p.name == "strength"]
    assert strength.default is None
    assert strength.defaults_by_block == {
        "check_inputs.inpaint_check_inputs": 0.9999,
        "check_inputs.img2img_check_inputs": 0.3,
    }
