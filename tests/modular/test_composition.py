"""Composition: aggregated declarations and the checks made when blocks are composed."""

import pytest
import torch
from diffusers import AutoencoderKL, UNet2DConditionModel

from modular import (
    BlockCompositionError,
    ComponentSpec,
    InputParam,
    ModularPipelineBlocks,
    OutputParam,
    SequentialPipelineBlocks,
)

from .toy_blocks import AddOne, AddOneThenDouble, Double, DoubleOrNegate, MakeTensor, SumLoop


def test_sequential_inputs_exclude_what_earlier_blocks_produce():
    """An input that an earlier child produces is not an input of the sequence."""
    blocks = AddOneThenDouble()
    assert [p.name for p in blocks.inputs] == ["x", "scale"]
    assert blocks.required_inputs == ["x"]
    assert blocks.intermediate_output_names == ["y", "z"]


def test_from_blocks_dict_keeps_order_and_accepts_classes():
    """from_blocks_dict builds children in the given order, instantiating classes."""
    blocks = SequentialPipelineBlocks.from_blocks_dict({"add": AddOne, "double": Double()})
    assert list(blocks.sub_blocks) == ["add", "double"]
    assert isinstance(blocks.sub_blocks["add"], AddOne)


def test_a_class_that_is_no_block_is_refused_naming_the_fix():
    """A plain class (the peer instantiates any class it is given) is refused as a sub-block: the error names
    the class and says to subclass ModularPipelineBlocks; an instance of one names its type."""

    class OnlyRequirements:
        _requirements = {"torch": ">=2.0"}

    with pytest.raises(
        TypeError,
        match=r"sub-block 'plain' is the class OnlyRequirements, which does not subclass ModularPipelineBlocks; "
        r"declare it as class OnlyRequirements\(ModularPipelineBlocks\)",
    ):
        SequentialPipelineBlocks.from_blocks_dict({"plain": OnlyRequirements})
    with pytest.raises(
        TypeError, match=r"sub-block 'plain' must be a ModularPipelineBlocks instance or class \(got a str\)"
    ):
        SequentialPipelineBlocks.from_blocks_dict({"plain": "AddOne"})


def test_input_only_a_later_block_produces_is_an_error_naming_both():
    """A required input produced only by a later block is refused, naming both blocks."""
    with pytest.raises(BlockCompositionError) as info:
        SequentialPipelineBlocks.from_blocks_dict({"double": Double, "add": AddOne})
    message = str(info.value)
    assert "'double' (Double) needs 'y', which only the later block 'add' (AddOne) produces" in message
    assert "move 'add' before 'double'" in message


class Refine(ModularPipelineBlocks):
    """y -> y + 1: reads and writes y, as a denoising loop reads and writes latents."""

    inputs = [InputParam("y", type_hint=int, required=True)]

    intermediate_outputs = [OutputParam("y", type_hint=int)]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.y += 1
        self.set_block_state(state, block_state)
        return components, state


def test_a_later_block_that_requires_what_it_writes_is_no_wrong_order():
    """Two stages that each require and write one value (two denoising loops on the caller's latents) compose:
    the first reads the given value, the second the first's; only a later block that makes the value without
    requiring it signals a wrong order."""
    blocks = SequentialPipelineBlocks.from_blocks_dict({"first": Refine, "second": Refine})
    assert blocks.init_pipeline()(y=1, output="y") == 3


class TensorToInt(ModularPipelineBlocks):
    inputs = [InputParam("t", type_hint=int, required=True)]

    def __call__(self, components, state):
        return components, state


def test_output_type_that_does_not_fit_its_consumer_is_an_error():
    """An OutputParam type that does not fit the InputParam reading it is refused, naming both."""
    with pytest.raises(BlockCompositionError) as info:
        SequentialPipelineBlocks.from_blocks_dict(
            {"add": AddOne, "double": Double, "tensor": MakeTensor, "bad": TensorToInt}
        )
    assert "'tensor' (MakeTensor) outputs 't' as Tensor, but 'bad' (TensorToInt) reads it as int" in str(
        info.value
    )


def _spec_block(name, spec):
    class WithSpec(ModularPipelineBlocks):
        expected_components = [spec]

        def __call__(self, components, state):
            return components, state

    WithSpec.__name__ = name
    return WithSpec()


def test_two_specs_of_one_name_that_disagree_are_an_error():
    """Two children declaring 'model' with unrelated types are refused, naming both blocks."""
    first = _spec_block("UsesUnet", ComponentSpec("model", UNet2DConditionModel))
    second = _spec_block("UsesVae", ComponentSpec("model", AutoencoderKL))
    with pytest.raises(BlockCompositionError) as info:
        SequentialPipelineBlocks.from_blocks_dict({"a": first, "b": second})
    assert "component 'model' is declared differently by 'a' (UsesUnet) and 'b' (UsesVae)" in str(info.value)
    assert "type UNet2DConditionModel vs AutoencoderKL" in str(info.value)


def test_agreeing_specs_merge_into_one():
    """Two children declaring the same component agree and appear once."""
    first = _spec_block("A", ComponentSpec("vae", AutoencoderKL))
    second = _spec_block("B", ComponentSpec("vae", AutoencoderKL, repo="org/x", subfolder="vae"))
    blocks = SequentialPipelineBlocks.from_blocks_dict({"a": first, "b": second})
    assert [s.name for s in blocks.expected_components] == ["vae"]
    assert blocks.expected_components[0].load_id == "org/x|vae|null|null"


def test_all_problems_are_reported_at_once():
    """Every wiring problem of a composition is listed in one error."""
    first = _spec_block("UsesUnet", ComponentSpec("model", UNet2DConditionModel))
    second = _spec_block("UsesVae", ComponentSpec("model", AutoencoderKL))
    with pytest.raises(BlockCompositionError) as info:
        SequentialPipelineBlocks.from_blocks_dict({"double": Double, "add": AddOne, "a": first, "b": second})
    assert len(info.value.problems) == 2


def test_sub_blocks_insert_pop_and_replace():
    """sub_blocks can be edited: insert at an index, pop, assign to replace."""
    blocks = AddOneThenDouble()
    blocks.sub_blocks.insert("tensor", MakeTensor(), 2)
    assert list(blocks.sub_blocks) == ["add", "double", "tensor"]
    assert "t" in blocks.intermediate_output_names
    popped = blocks.sub_blocks.pop("tensor")
    assert isinstance(popped, MakeTensor)
    blocks.sub_blocks["double"] = DoubleOrNegate()
    assert isinstance(blocks.sub_blocks["double"], DoubleOrNegate)


def test_an_edit_that_breaks_the_composition_is_undone():
    """Inserting a block that needs a later output raises and leaves sub_blocks as they were."""
    blocks = AddOneThenDouble()
    with pytest.raises(BlockCompositionError):
        blocks.sub_blocks.insert("tensor_first", MakeTensor(), 0)
    assert list(blocks.sub_blocks) == ["add", "double"]


def test_insert_under_an_existing_name_is_refused():
    """insert() under a name that exists raises a KeyError that says how to replace instead."""
    blocks = AddOneThenDouble()
    with pytest.raises(KeyError, match="assign to replace it"):
        blocks.sub_blocks.insert("add", AddOne(), 0)


def test_auto_blocks_inputs_required_only_when_every_branch_needs_them():
    """Auto blocks: 'y' is required by both branches, 'flip' and 'scale' by neither."""
    blocks = DoubleOrNegate()
    params = {p.name: p for p in blocks.inputs}
    assert params["y"].required
    assert not params["flip"].required and not params["scale"].required


def test_loop_aggregates_loop_inputs_and_children():
    """A loop's inputs are its loop_inputs plus what its children read."""
    loop = SumLoop()
    assert [p.name for p in loop.inputs] == ["n", "total"]
    assert loop.intermediate_output_names == ["total"]


def test_leaf_outputs_must_be_set():
    """set_block_state refuses a declared output the block did not set."""

    class Forgets(ModularPipelineBlocks):
        intermediate_outputs = [OutputParam("out")]

        def __call__(self, components, state):
            self.set_block_state(state, self.get_block_state(state))
            return components, state

    from modular import PipelineState

    with pytest.raises(ValueError, match="declares output 'out' but did not set it"):
        Forgets()(None, PipelineState())


def test_tensor_type_hint_is_checked_in_composition():
    """A torch.Tensor output fits a torch.Tensor input."""

    class ReadsTensor(ModularPipelineBlocks):
        inputs = [InputParam("t", type_hint=torch.Tensor, required=True)]

        def __call__(self, components, state):
            return components, state

    SequentialPipelineBlocks.from_blocks_dict(
        {"add": AddOne, "d": Double, "make": MakeTensor, "read": ReadsTensor}
    )
