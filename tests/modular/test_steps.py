"""One walk: the steps each block kind lists, the cached call plan built on them, and the docs that show them."""

import pytest
import torch

from modular import (
    AutoPipelineBlocks,
    ComponentNotLoadedError,
    ComponentSpec,
    ConditionalPipelineBlocks,
    InputParam,
    MissingInputError,
    ModularPipelineBlocks,
    OutputParam,
    PipelineState,
    SequentialPipelineBlocks,
)
from modular.framework.planning import plan_call
from modular.framework.steps import Known, StepKind

from .test_selection import ByValue, ExtraOrDouble, Pipeline
from .toy_blocks import AddOne, AddOneThenDouble, Double, DoubleOrNegate, Negate, SumLoop


def paths(steps):
    return [step.path for step in steps]


# ----- the walk, per block kind -----


def test_a_leaf_is_one_step_of_itself():
    """A leaf lists one leaf step: itself, with an empty path and its own components."""
    block = AddOne()
    [step] = block.execution_steps({"x"})
    assert step.block is block and step.path == () and step.name == "" and step.kind is StepKind.LEAF
    assert step.uses == () and step.body == ()


def test_sequential_lists_its_children_in_order():
    """A sequence lists its children's steps in order, each named by its path, the very child blocks."""
    blocks = AddOneThenDouble()
    steps = blocks.execution_steps({"x"})
    assert paths(steps) == [("add",), ("double",)]
    assert [step.block for step in steps] == list(blocks.sub_blocks.values())
    assert [step.name for step in steps] == ["add", "double"]


def test_auto_lists_the_triggered_branch_or_the_default():
    """An auto block lists the steps of the branch whose trigger is given, else of the default branch."""
    assert paths(Pipeline().execution_steps({"x", "flip"})) == [("add",), ("branch", "negate")]
    assert paths(Pipeline().execution_steps({"x"})) == [("add",), ("branch", "double")]
    assert paths(Pipeline().execution_steps({"x": 1, "flip": None})) == [("add",), ("branch", "double")]


def test_conditional_choosing_nothing_lists_no_steps():
    """A conditional whose select_block returns None lists no steps."""
    assert ByValue().execution_steps({"y": None}) == []


def test_conditional_on_given_values_chooses_from_the_values():
    """A custom select_block on a given input is made from its value when the walk has the values."""
    assert paths(ByValue().execution_steps({"y": 3})) == [("negate",)]
    assert paths(ByValue().execution_steps({"y": 4})) == [("double",)]


def test_conditional_on_given_names_only_is_left_to_run_time_and_asks_for_values():
    """From names alone a value-based choice on a given input is a run-time step, and the walk says values would tell."""
    known = Known.of({"y"})
    [step] = ByValue().execution_steps(known)
    assert step.kind is StepKind.CHOICE and known.needs_values is True


def test_a_choice_on_a_produced_value_is_a_run_time_step():
    """A value-based choice on what an earlier step makes is one choice step, producing any branch's outputs."""
    blocks = SequentialPipelineBlocks.from_blocks_dict({"add": AddOne, "branch": ExtraOrDouble})
    known = Known.of({"x": -1})
    steps = blocks.execution_steps(known)
    assert [(step.path, step.kind) for step in steps] == [
        (("add",), StepKind.LEAF),
        (("branch",), StepKind.CHOICE),
    ]
    assert steps[1].block is blocks.sub_blocks["branch"]
    assert known.produced == {"y", "z"} and known.needs_values is False


def test_a_presence_choice_on_a_produced_value_counts_it_present():
    """A stock auto block triggered by an output of an earlier step chooses that branch before the run."""

    class ByY(AutoPipelineBlocks):
        block_classes = [Negate, Double]
        block_names = ["negate", "double"]
        block_trigger_inputs = ["y", None]

    blocks = SequentialPipelineBlocks.from_blocks_dict({"add": AddOne, "branch": ByY})
    assert paths(blocks.execution_steps({"x"})) == [("add",), ("branch", "negate")]


def test_a_loop_is_one_step_with_its_body():
    """A loop lists one loop step carrying its own components and, as its body, its children's steps."""
    loop = SumLoop()
    [step] = loop.execution_steps({"n"})
    assert step.kind is StepKind.LOOP and step.block is loop
    assert paths(step.body) == [("accumulate",)] and step.body[0].kind is StepKind.LEAF


def test_nested_blocks_list_flat_steps_with_full_paths():
    """Sequences and choices nested in each other flatten into one list; loops stay whole."""
    inner = SequentialPipelineBlocks.from_blocks_dict({"add": AddOne, "branch": DoubleOrNegate})
    blocks = SequentialPipelineBlocks.from_blocks_dict({"outer": inner, "loop": SumLoop})
    steps = blocks.execution_steps({"x", "flip", "n"})
    assert paths(steps) == [("outer", "add"), ("outer", "branch", "negate"), ("loop",)]
    assert [step.kind for step in steps] == [StepKind.LEAF, StepKind.LEAF, StepKind.LOOP]
    assert paths(steps[2].body) == [("loop", "accumulate")]


def test_get_execution_blocks_are_the_walks_blocks():
    """get_execution_blocks holds exactly the blocks of the walk's steps, named by their names."""
    blocks = Pipeline()
    steps = blocks.execution_steps({"x": 1, "flip": True})
    pruned = blocks.get_execution_blocks(x=1, flip=True)
    assert list(pruned.sub_blocks.items()) == [(step.name, step.block) for step in steps]


def test_a_conditional_prunes_to_its_chosen_child():
    """get_execution_blocks of a conditional is the chosen leaf itself, or None when nothing runs."""
    blocks = ByValue()
    assert blocks.get_execution_blocks(y=3) is blocks.sub_blocks["negate"]
    assert blocks.get_execution_blocks() is None


def test_a_composite_called_directly_runs_its_walk():
    """Calling a sequence outside a pipeline runs the steps its walk lists for the state's values."""
    state = PipelineState()
    state.set("x", 1)
    state.set("flip", True)
    _, state = Pipeline()(None, state)
    assert state.z == -2


# ----- the call plan -----


def test_plan_uses_the_walks_steps():
    """The call plan's steps are the walk's steps for the names given."""
    blocks = Pipeline()
    plan = plan_call(blocks, {"x": 1, "flip": True}, {})
    assert plan.steps == tuple(blocks.execution_steps({"x", "flip"}))
    assert plan.outputs == {"x", "flip", "y", "z"}


def test_plan_is_made_once_per_set_of_given_names():
    """Calls given the same input names reuse one plan; other names get their own; None counts as not given."""
    pipe = Pipeline().init_pipeline()
    first, _ = pipe._plan({"x": 1}, None)
    assert pipe._plan({"x": 2}, None)[0] is first
    assert pipe._plan({"x": 2, "flip": None}, None)[0] is first
    flipped, _ = pipe._plan({"x": 2, "flip": True}, None)
    assert flipped is not first
    state = PipelineState()
    state.set("flip", True)
    assert pipe._plan({"x": 3}, state)[0] is flipped


def test_a_cached_plan_runs_without_walking_again(monkeypatch):
    """A second call with the same input names runs the cached steps: the blocks are not walked again."""
    pipe = Pipeline().init_pipeline()
    assert pipe(x=1, output="z") == 4

    def no_walk(self, given, path=()):
        raise AssertionError("walked again")

    monkeypatch.setattr(SequentialPipelineBlocks, "execution_steps", no_walk)
    assert pipe(x=5, output="z") == 12


class UsesModel(ModularPipelineBlocks):
    """Reads the model's output size (needs component 'model')."""

    expected_components = [ComponentSpec("model", torch.nn.Linear)]

    intermediate_outputs = [OutputParam("size", type_hint=int)]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.size = components.model.out_features
        self.set_block_state(state, block_state)
        return components, state


def test_update_components_forgets_the_plans():
    """update_components drops cached plans, so the next call plans with the new components."""
    pipe = UsesModel().init_pipeline()
    pipe.update_components(model=torch.nn.Linear(1, 2))
    before, _ = pipe._plan({}, None)
    pipe.update_components(model=torch.nn.Linear(1, 3))
    assert pipe._plan({}, None)[0] is not before
    assert pipe(output="size") == 3


def test_unload_components_forgets_the_plans():
    """After unload_components a call is refused up front again, though a plan was cached while it was loaded."""
    pipe = UsesModel().init_pipeline()
    pipe.update_components(model=torch.nn.Linear(1, 2))
    assert pipe(output="size") == 2
    pipe.unload_components("model")
    with pytest.raises(ComponentNotLoadedError, match=r"needs component 'model', which is not loaded"):
        pipe()


def test_sub_block_edits_forget_the_plans():
    """Editing sub-blocks, also nested ones, makes the next call plan and run the edited blocks."""
    inner = AddOneThenDouble()
    blocks = SequentialPipelineBlocks.from_blocks_dict({"inner": inner})
    pipe = blocks.init_pipeline()
    assert pipe(x=1, output="z") == 4
    inner.sub_blocks["double"] = Negate()
    assert pipe(x=1, output="z") == -2
    blocks.sub_blocks.pop("inner")
    blocks.sub_blocks["add"] = AddOne()
    assert pipe(x=1, output="y") == 2


def test_a_choice_on_a_given_value_is_still_checked_before_the_run():
    """With a value-based choice on a given input, each call is planned with its values: bad ones fail up front."""
    ran = []

    class Probe(ModularPipelineBlocks):
        inputs = [InputParam("y", type_hint=int)]

        def __call__(self, components, state):
            ran.append(True)
            return components, state

    pipe = SequentialPipelineBlocks.from_blocks_dict(
        {"probe": Probe, "branch": ExtraOrDouble}
    ).init_pipeline()
    assert pipe(y=0, output="z") == 0
    with pytest.raises(MissingInputError, match=r"block 'needs_extra' \(NeedsExtra\) needs input 'extra'"):
        pipe(y=1)
    assert ran == [True]  # the refused call ran nothing
    assert pipe(y=1, extra=5, output="z") == 6


def test_a_run_time_choice_uses_no_components_up_front():
    """A choice left to run time adds no components to the plan: which branch runs is not known yet."""

    class ModelBranch(ModularPipelineBlocks):
        expected_components = [ComponentSpec("model", torch.nn.Linear)]

        inputs = [InputParam("y", type_hint=int, required=True)]

        intermediate_outputs = [OutputParam("z", type_hint=int)]

    class Choice(ConditionalPipelineBlocks):
        block_classes = [ModelBranch, Double]
        block_names = ["model", "double"]
        block_trigger_inputs = ["y"]

        def select_block(self, y=None):
            return "model" if y else "double"

    blocks = SequentialPipelineBlocks.from_blocks_dict({"add": AddOne, "branch": Choice})
    plan = plan_call(blocks, {"x"}, {"model": None})
    assert [step.kind for step in plan.steps] == [StepKind.LEAF, StepKind.CHOICE]
    assert plan.component_uses == ()
    assert blocks.init_pipeline()(x=-1, output="z") == 0


# ----- the docs -----


def test_tree_labels_a_value_selector_by_its_rule():
    """repr labels the children of a value-based selector with its select_block, not with 'when ... given'."""
    text = repr(ByValue())
    assert "  negate (chosen by select_block(y)): Negate" in text
    assert "  double (chosen by select_block(y)): Double" in text
    assert "given" not in text


def test_tree_labels_an_auto_block_with_a_custom_rule_by_its_rule():
    """An auto block whose select_block is its own is labelled by that rule, not by the stock trigger text."""

    class Odd(AutoPipelineBlocks):
        block_classes = [Negate, Double]
        block_names = ["negate", "double"]
        block_trigger_inputs = ["y", None]

        def select_block(self, y=None):
            return "negate" if y and y % 2 else "double"

    text = repr(Odd())
    assert "  negate (chosen by select_block(y)): Negate" in text
    assert "when y given" not in text and "(default)" not in text


def test_doc_lists_the_steps_of_each_workflow():
    """doc lists, per named workflow, the steps the walk lists for its inputs."""
    assert "  Steps per workflow:\n    negate: add -> negate\n    double: add -> double\n" in Pipeline().doc


def test_doc_marks_a_choice_left_to_run_time():
    """doc shows a choice that only the run can make as such in a workflow's steps."""

    class Flow(SequentialPipelineBlocks):
        block_classes = [AddOne, ExtraOrDouble]
        block_names = ["add", "branch"]
        _workflow_map = {"any": {"x": True}}

    assert "    any: add -> branch (chosen at run time)" in Flow().doc
