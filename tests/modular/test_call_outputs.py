"""A call's outputs are ordinary tensors a caller may change in place, as classic and peer pipelines return."""

from collections import namedtuple

import pytest
import torch

from blocks.stable_diffusion import make_tiny_repo
from components import ComponentsManager
from modular import InputParam, ModularPipelineBlocks, OutputParam
from modular.pipeline.outputs import changeable

from .tiny_sd import tiny_sd_pipeline
from .toy_blocks import MakeTensor

Pair = namedtuple("Pair", ["left", "right"])


class MakeMany(ModularPipelineBlocks):
    """given -> same (given back), t, alias (t again), many (a list and a namedtuple of tensors), words."""

    inputs = [InputParam("given", type_hint=torch.Tensor, required=True)]

    intermediate_outputs = [OutputParam(name) for name in ("same", "t", "alias", "many", "words")]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.t = torch.ones(3)
        block_state.same, block_state.alias = block_state.given, block_state.t
        block_state.many = [torch.zeros(2), Pair(torch.ones(1), "text")]
        block_state.words = ["a", "b"]
        self.set_block_state(state, block_state)
        return components, state


def test_a_returned_tensor_can_be_changed_in_place():
    """A tensor made during the call comes back as an ordinary tensor: mul_ works on it outside the call."""
    out = MakeTensor().init_pipeline()(z=2, output="t")
    assert not out.is_inference()
    out.mul_(2)
    assert torch.equal(out, torch.full((2, 3), 4.0))


def test_tensors_in_a_returned_state_or_dict_can_be_changed_in_place():
    """Every tensor of a returned state or dict of outputs, also inside lists and namedtuples, is ordinary."""
    pipe = MakeMany().init_pipeline()
    state = pipe(given=torch.zeros(1))
    state.t.add_(1)
    state.many[0].add_(1)
    state.many[1].left.add_(1)
    assert isinstance(state.many[1], Pair) and state.many[1].right == "text"
    outputs = pipe(given=torch.zeros(1), output=["t", "many"])
    outputs["t"].add_(1)
    outputs["many"][1].left.add_(1)


def test_what_needs_no_clone_is_returned_as_it_is():
    """A tensor the caller passed comes back as the same object; containers without tensors are not copied."""
    given = torch.zeros(1)
    state = MakeMany().init_pipeline()(given=given)
    assert state.same is given
    assert state.alias is state.t  # one tensor under two names stays one tensor
    words = ["a"]
    assert changeable(words) is words
    named = {"w": words, "t": given}
    assert changeable(named) is named


def test_blocks_still_run_in_inference_mode():
    """Only what is returned is cloned: the blocks run under torch.inference_mode() (its speed is kept)."""
    seen = {}

    class Probe(MakeTensor):
        def __call__(self, components, state):
            seen["inference"] = torch.is_inference_mode_enabled()
            return super().__call__(components, state)

    Probe().init_pipeline()(z=1)
    assert seen == {"inference": True}


@pytest.mark.parametrize("output_type", ["pt", "latent"])
def test_sd_images_can_be_changed_in_place(tmp_path, output_type):
    """A Stable Diffusion call's images (tensors) can be changed in place, as StableDiffusionPipeline's can."""
    pipe = tiny_sd_pipeline(make_tiny_repo(tmp_path / "repo"), ComponentsManager())
    images = pipe(prompt="a cat", num_inference_steps=1, output_type=output_type, output="images")
    expected = images * 2
    images.mul_(2)
    assert torch.equal(images, expected)
