"""User blocks inserted into the Stable Diffusion blocks, including one written against the peer's API."""

import pytest
import torch
from diffusers import ConfigMixin
from diffusers.configuration_utils import register_to_config
from diffusers.utils.torch_utils import randn_tensor

from blocks.stable_diffusion import StableDiffusionAutoBlocks
from modular import BlockCompositionError, ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam

from .conftest import SD, classic_from

STEPS = 2


class LatentScaler(ConfigMixin):
    """A user component made from a config: the factor to scale the initial latents by."""

    config_name = "latent_scaler.json"

    @register_to_config
    def __init__(self, factor: float = 0.5):
        pass


class ScaleLatentsStep(ModularPipelineBlocks):
    """A user leaf block: multiplies the initial latents by a factor (an input, else the component's)."""

    model_name = "stable-diffusion"

    description = (
        "Scales the initial latents by latent_scale (default: the latent_scaler component's factor)."
    )

    expected_components = [
        ComponentSpec(
            "latent_scaler", LatentScaler, config={"factor": 0.5}, default_creation_method="from_config"
        )
    ]

    inputs = [
        InputParam("latents", type_hint=torch.Tensor, required=True),
        InputParam("latent_scale", type_hint=float, description="Overrides the scaler's factor."),
    ]

    intermediate_outputs = [
        OutputParam("latents", type_hint=torch.Tensor, description="The scaled initial latents."),
        OutputParam("applied_scale", type_hint=float, description="The factor used."),
    ]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        scale = block_state.latent_scale
        if scale is None:
            scale = components.latent_scaler.config.factor
        block_state.latents = block_state.latents * scale
        block_state.applied_scale = scale
        self.set_block_state(state, block_state)
        return components, state


def reuse_models(pipe, source):
    """Give `pipe` the very model objects of `source` (no second load)."""
    pipe.update_components(**{name: getattr(source, name) for name in SD.components})
    pipe.set_progress_bar_config(disable=True)


def initial_noise(seed, shape=(1, 4, 32, 32)):
    """The noise the text-to-image prepare step draws first from a generator with this seed."""
    return randn_tensor(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=torch.float32)


def test_inserted_user_block_scales_initial_latents(sd_repo, sd_pipe):
    """An inserted user block (own inputs, outputs and from_config component) changes the output as designed."""
    blocks = StableDiffusionAutoBlocks()
    index = list(blocks.sub_blocks).index("denoise")
    blocks.sub_blocks.insert("scale_latents", ScaleLatentsStep(), index)
    assert list(blocks.sub_blocks)[index] == "scale_latents"
    assert "latent_scale" in blocks.input_names
    pipe = blocks.init_pipeline(sd_repo)
    assert isinstance(pipe.latent_scaler, LatentScaler)  # made from its config, no repo needed
    reuse_models(pipe, sd_pipe)
    classic = classic_from(sd_pipe, "text2image")

    for scale, expected_scale in [(None, 0.5), (2.0, 2.0)]:
        state = pipe(
            prompt="a photo of a cat",
            latent_scale=scale,
            num_inference_steps=STEPS,
            generator=torch.Generator("cpu").manual_seed(0),
            output_type="np",
        )
        assert state.get("applied_scale") == expected_scale
        # init_noise_sigma is 1.0 for PNDM, so scaling before or after it is the same multiplication.
        assert sd_pipe.scheduler.init_noise_sigma == 1.0
        expected = classic(
            "a photo of a cat",
            latents=initial_noise(0) * expected_scale,
            num_inference_steps=STEPS,
            output_type="np",
        ).images
        assert torch.equal(torch.from_numpy(state.get("images")), torch.from_numpy(expected))

    unscaled = sd_pipe(
        prompt="a photo of a cat",
        num_inference_steps=STEPS,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="np",
        output="images",
    )
    assert not torch.equal(torch.from_numpy(unscaled), torch.from_numpy(state.get("images")))


def test_user_block_before_its_producer_is_rejected():
    """Inserting a block that needs latents before the block that makes them names both blocks."""
    blocks = StableDiffusionAutoBlocks()
    with pytest.raises(BlockCompositionError) as info:
        blocks.sub_blocks.insert("scale_latents", ScaleLatentsStep(), 0)
    message = str(info.value)
    assert "'scale_latents' (ScaleLatentsStep) needs 'latents'" in message
    assert "'before_denoise'" in message
    assert "scale_latents" not in blocks.sub_blocks  # the failed edit changed nothing


# A block as a user of the peer (diffusers' Modular Diffusers) writes it. Only the import line differs.
PEER_IMPORTS = (
    "from diffusers.modular_pipelines import ModularPipelineBlocks, InputParam, OutputParam, ComponentSpec"
)
OUR_IMPORTS = "from modular import ModularPipelineBlocks, InputParam, OutputParam, ComponentSpec"
PEER_BLOCK_SOURCE = """
import torch
from diffusers import UNet2DConditionModel
{imports}


class NoiseOffsetStep(ModularPipelineBlocks):
    model_name = "stable-diffusion"

    @property
    def description(self) -> str:
        return "Adds noise_offset to the initial latents, in the UNet's dtype"

    @property
    def expected_components(self):
        return [ComponentSpec("unet", UNet2DConditionModel)]

    @property
    def inputs(self):
        return [
            InputParam("latents", required=True, type_hint=torch.Tensor, description="initial latents"),
            InputParam("noise_offset", default=0.1, type_hint=float, description="offset added to the latents"),
        ]

    @property
    def intermediate_outputs(self):
        return [OutputParam("latents", type_hint=torch.Tensor, description="offset initial latents")]

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        offset = torch.tensor(block_state.noise_offset, dtype=components.unet.dtype)
        block_state.latents = block_state.latents + offset
        self.set_block_state(state, block_state)
        return components, state
"""


def build_block(imports):
    """Exec the block source with the given import line; return an instance of its block class."""
    namespace = {}
    exec(PEER_BLOCK_SOURCE.format(imports=imports), namespace)  # our own fixed source text
    return namespace["NoiseOffsetStep"]()


def test_peer_block_runs_with_imports_changed(sd_repo, sd_pipe):
    """A leaf block written for the peer's API runs in our SD pipeline with only its import line changed."""
    import diffusers.modular_pipelines as peer

    peer_block = build_block(PEER_IMPORTS)
    assert isinstance(peer_block, peer.ModularPipelineBlocks)  # it is valid peer code
    assert [p.name for p in peer_block.inputs] == ["latents", "noise_offset"]

    block = build_block(OUR_IMPORTS)
    blocks = StableDiffusionAutoBlocks()
    blocks.sub_blocks.insert("noise_offset", block, list(blocks.sub_blocks).index("denoise"))
    pipe = blocks.init_pipeline(sd_repo)
    reuse_models(pipe, sd_pipe)
    ours = pipe(
        prompt="a cat",
        noise_offset=0.25,
        num_inference_steps=STEPS,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="latent",
        output="images",
    )
    theirs = classic_from(sd_pipe, "text2image")(
        "a cat", latents=initial_noise(0) + 0.25, num_inference_steps=STEPS, output_type="latent"
    ).images
    assert torch.equal(ours, theirs)
