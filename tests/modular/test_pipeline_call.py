"""Calling a pipeline: inputs, outputs, defaults, and bad calls that change nothing."""

import logging

import pytest
import torch
from diffusers import AutoencoderKL

from modular import (
    ComponentNotLoadedError,
    ComponentSpec,
    InputParam,
    InputTypeError,
    MissingInputError,
    ModularPipelineBlocks,
    OutputParam,
    PipelineState,
    SequentialPipelineBlocks,
    UnknownInputError,
    UnknownOutputError,
)

from .test_selection import Pipeline
from .toy_blocks import AddOneThenDouble, SumLoop


def test_call_returns_state_one_value_or_a_dict():
    """pipe(...) returns the state; output='z' one value; output=[...] a dict."""
    pipe = AddOneThenDouble().init_pipeline()
    state = pipe(x=1)
    assert isinstance(state, PipelineState) and state.z == 4
    assert pipe(x=1, output="z") == 4
    assert pipe(x=1, scale=3, output=["y", "z"]) == {"y": 2, "z": 6}


def test_auto_branch_is_chosen_at_run_time():
    """The branch runs according to the inputs given."""
    pipe = Pipeline().init_pipeline()
    assert pipe(x=1, output="z") == 4
    assert pipe(x=1, flip=True, output="z") == -2


def test_loop_children_share_one_block_state():
    """A loop's children accumulate on one block state across iterations."""
    pipe = SumLoop().init_pipeline()
    pipe.set_progress_bar_config(disable=True)
    assert pipe(n=5, output="total") == 10


def test_nested_loop_progress_bars_are_configured(capsys):
    """set_progress_bar_config reaches loops nested in compositions."""
    blocks = SequentialPipelineBlocks.from_blocks_dict(
        {"outer": SequentialPipelineBlocks.from_blocks_dict({"loop": SumLoop})}
    )
    pipe = blocks.init_pipeline()
    pipe.set_progress_bar_config(disable=True)
    assert blocks.sub_blocks["outer"].sub_blocks["loop"]._progress_bar_config == {"disable": True}
    pipe(n=3)
    assert capsys.readouterr().err == ""


def test_missing_required_input_names_the_block_and_input():
    """A missing required input raises, naming the block that needs it."""
    pipe = AddOneThenDouble().init_pipeline()
    with pytest.raises(
        MissingInputError, match=r"block 'add' \(AddOne\) needs input 'x', which was not given"
    ):
        pipe()


def test_unknown_keyword_names_the_closest_valid_input():
    """An unknown keyword is a TypeError naming the closest valid input."""
    pipe = AddOneThenDouble().init_pipeline()
    with pytest.raises(UnknownInputError, match=r"unknown input 'scal'; did you mean 'scale'\?"):
        pipe(x=1, scal=3)
    assert isinstance(UnknownInputError("x"), TypeError)


def test_an_unknown_keyword_lists_the_inputs_a_caller_can_pass_closest_first():
    """The listing names the pipeline's own inputs, closest first, not the values its blocks make for each other
    (`y`, made by `add` for `double`); diffusers' `return_dict` is told what stands for it."""
    pipe = AddOneThenDouble().init_pipeline()
    with pytest.raises(UnknownInputError) as caught:
        pipe(x=1, scal=3)
    assert str(caught.value).endswith("(inputs, closest first: scale, x; pipe.doc lists them)")
    with pytest.raises(
        UnknownInputError, match=r"'return_dict'; a call returns the state, or one value with output="
    ):
        pipe(x=1, return_dict=False)


def test_wrong_type_for_a_typed_input_is_refused():
    """A value of the wrong type for a typed input raises InputTypeError (a TypeError)."""
    pipe = AddOneThenDouble().init_pipeline()
    with pytest.raises(InputTypeError, match=r"input 'x' must be int \(got 'one' that is a str\)"):
        pipe(x="one")


def test_unknown_output_lists_the_available_outputs():
    """output='nope' raises, listing the available outputs."""
    pipe = AddOneThenDouble().init_pipeline()
    with pytest.raises(
        UnknownOutputError,
        match=r"output='nope' is not produced by this call; available outputs: \['x', 'y', 'z'\]",
    ):
        pipe(x=1, output="nope")


class UsesVae(ModularPipelineBlocks):
    expected_components = [ComponentSpec("vae", AutoencoderKL)]

    intermediate_outputs = [OutputParam("done")]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.done = True
        self.set_block_state(state, block_state)
        return components, state


def test_unloaded_component_is_named_with_the_fix():
    """A block needing an unloaded component raises, naming it and load_components."""
    pipe = UsesVae().init_pipeline()
    with pytest.raises(
        ComponentNotLoadedError,
        match=r"needs component 'vae', which is not loaded; call pipe.load_components\(\['vae'\]\)",
    ):
        pipe()


def test_bad_calls_leave_the_pipeline_and_given_state_unchanged():
    """A refused call leaves the given state and the pipeline as they were."""
    pipe = AddOneThenDouble().init_pipeline()
    state = PipelineState()
    state.set("x", 1)
    for bad in ({"x": "one"}, {"scal": 1}):
        with pytest.raises(TypeError):
            pipe(state, **bad)
    assert state.values == {"x": 1}
    assert pipe(state, output="z") == 4
    assert state.values == {"x": 1}


def test_error_inside_a_block_names_the_block_once(caplog):
    """An error raised inside a block carries a note naming the block, and nothing is logged."""

    class Fails(ModularPipelineBlocks):
        inputs = [InputParam("x")]

        def __call__(self, components, state):
            raise RuntimeError("boom")

    pipe = SequentialPipelineBlocks.from_blocks_dict(
        {"outer": SequentialPipelineBlocks.from_blocks_dict({"fails": Fails})}
    ).init_pipeline()
    with caplog.at_level(logging.DEBUG), pytest.raises(RuntimeError, match="boom") as info:
        pipe(x=1)
    assert info.value.__notes__ == ["(raised in block 'fails': Fails)"]
    assert caplog.records == []


def test_runs_under_inference_mode():
    """Blocks run under torch.inference_mode()."""
    seen = {}

    class Probe(ModularPipelineBlocks):
        intermediate_outputs = [OutputParam("flag")]

        def __call__(self, components, state):
            block_state = self.get_block_state(state)
            block_state.flag = seen["mode"] = torch.is_inference_mode_enabled()
            self.set_block_state(state, block_state)
            return components, state

    Probe().init_pipeline()()
    assert seen["mode"] is True


def test_defaults_fill_inputs_not_given():
    """An input's default is used when it is not given."""
    pipe = AddOneThenDouble().init_pipeline()
    state = pipe(x=2)
    assert state.scale == 2 and state.z == 6


def test_each_branch_applies_its_own_default():
    """Branches declaring one input with different defaults each use their own (no leaking)."""
    from modular import AutoPipelineBlocks

    def scaler(default):
        class Scaler(ModularPipelineBlocks):
            inputs = [
                InputParam("x", type_hint=int, required=True),
                InputParam("k", type_hint=int, default=default),
            ]

            intermediate_outputs = [OutputParam("out", type_hint=int)]

            def __call__(self, components, state):
                block_state = self.get_block_state(state)
                block_state.out = block_state.x * block_state.k
                self.set_block_state(state, block_state)
                return components, state

        return Scaler

    class Choose(AutoPipelineBlocks):
        block_classes = [scaler(10), scaler(3)]
        block_names = ["big", "small"]
        block_trigger_inputs = ["big", None]

    pipe = Choose().init_pipeline()
    assert pipe(x=2, output="out") == 6
    assert pipe(x=2, big=True, output="out") == 20
    assert pipe(x=2, k=5, output="out") == 10
