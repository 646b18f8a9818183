"""Branch selection, execution blocks and named workflows."""

import pytest

from modular import (
    ConditionalPipelineBlocks,
    InputParam,
    ModularPipelineBlocks,
    OutputParam,
    SequentialPipelineBlocks,
)

from .toy_blocks import AddOne, Double, DoubleOrNegate, Negate


class Pipeline(SequentialPipelineBlocks):
    """x -> y -> z, doubling or negating."""

    block_classes = [AddOne, DoubleOrNegate]
    block_names = ["add", "branch"]
    _workflow_map = {"negate": {"x": True, "flip": True}, "double": {"x": True}}


def test_auto_blocks_pick_the_triggered_branch_or_the_default():
    """AutoPipelineBlocks picks the branch whose trigger is given, else the None branch."""
    blocks = DoubleOrNegate()
    assert blocks.select_block(flip=True) == "negate"
    assert blocks.select_block() == "double"


def test_get_execution_blocks_flattens_what_would_run():
    """get_execution_blocks returns the leaves that run for the given inputs, in order."""
    blocks = Pipeline()
    assert list(blocks.get_execution_blocks(x=1).sub_blocks) == ["add", "double"]
    assert list(blocks.get_execution_blocks(x=1, flip=True).sub_blocks) == ["add", "negate"]


def test_none_valued_trigger_counts_as_absent():
    """A trigger input passed as None does not select its branch."""
    assert list(Pipeline().get_execution_blocks(x=1, flip=None).sub_blocks) == ["add", "double"]


def test_workflows_are_listed_and_pruned():
    """available_workflows lists the names; get_workflow prunes to the blocks of one."""
    blocks = Pipeline()
    assert blocks.available_workflows == ["negate", "double"]
    assert list(blocks.get_workflow("negate").sub_blocks) == ["add", "negate"]


def test_unknown_workflow_lists_the_available_ones():
    """An unknown workflow name raises a KeyError listing the workflows; a ValueError too, as the peer's."""
    for kind in (KeyError, ValueError):
        with pytest.raises(
            kind, match=r"has no workflow 'nope'. Available workflows: \['negate', 'double'\]"
        ):
            Pipeline().get_workflow("nope")


def test_blocks_without_workflows_say_so():
    """available_workflows on blocks without a _workflow_map raises NotImplementedError."""
    with pytest.raises(NotImplementedError, match="defines no named workflows"):
        DoubleOrNegate().available_workflows  # noqa: B018


class ByValue(ConditionalPipelineBlocks):
    """Negates when y is odd (a custom rule on the value, not just its presence)."""

    block_classes = [Negate, Double]
    block_names = ["negate", "double"]
    block_trigger_inputs = ["y"]

    def select_block(self, y=None):
        if y is None:
            return None
        return "negate" if y % 2 else "double"


def test_conditional_blocks_use_a_custom_select_block():
    """ConditionalPipelineBlocks runs the child its select_block names for the trigger values."""
    blocks = ByValue()
    assert blocks.select_block(y=3) == "negate"
    assert blocks.select_block(y=4) == "double"
    assert blocks.get_execution_blocks(y=None) is None


def test_select_block_returning_an_unknown_name_is_an_error():
    """A select_block that names no sub-block raises a KeyError listing the sub-blocks."""

    class Broken(ByValue):
        def select_block(self, y=None):
            return "nope"

    with pytest.raises(KeyError, match=r"returned 'nope', which is not a sub-block"):
        Broken().get_execution_blocks(y=1)


def test_auto_blocks_need_one_trigger_per_branch():
    """Auto blocks with fewer triggers than branches are refused."""

    class Mismatched(DoubleOrNegate):
        block_trigger_inputs = ["flip"]

    with pytest.raises(ValueError, match="block_trigger_inputs has 1 entries for 2 sub-blocks"):
        Mismatched()


class NeedsExtra(ModularPipelineBlocks):
    """z = y + extra (extra required)"""

    inputs = [
        InputParam("y", type_hint=int, required=True),
        InputParam("extra", type_hint=int, required=True),
    ]

    intermediate_outputs = [OutputParam("z", type_hint=int)]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.z = block_state.y + block_state.extra
        self.set_block_state(state, block_state)
        return components, state


class ExtraOrDouble(ConditionalPipelineBlocks):
    """Adds extra when y is truthy, else doubles: decided on y's value (one an earlier block makes, or one the
    caller gives)."""

    block_classes = [NeedsExtra, Double]
    block_names = ["needs_extra", "double"]
    block_trigger_inputs = ["y"]

    def select_block(self, y=None):
        return "needs_extra" if y else "double"


def test_a_choice_on_a_produced_value_is_left_to_run_time():
    """A custom select_block on a value an earlier block makes is not guessed before the run."""
    blocks = SequentialPipelineBlocks.from_blocks_dict({"add": AddOne, "branch": ExtraOrDouble})
    pipe = blocks.init_pipeline()
    assert pipe(x=-1, output="z") == 0  # y == 0 -> double; 'extra' is not demanded up front
    assert pipe(x=1, extra=5, output="z") == 7
