"""Components a repo's index lists as [null, null]: recorded as absent, and planned without where a block allows it.

Wan 2.1 repos list ``transformer_2`` so, Wan 2.2 image-to-video repos ``image_encoder``; the blocks run without
them. A component that is only not loaded yet is still an error, and one the blocks need names the repo.
"""

import json

import pytest
from diffusers import DDIMScheduler

from modular import ComponentNotLoadedError, ComponentSpec, InputParam, ModularPipelineBlocks, OutputParam
from modular.framework.planning import plan_call


class UsesOptionalModel(ModularPipelineBlocks):
    """x -> y: x doubled when the pipeline has `model` (any component stands in for a model), else x."""

    expected_components = [ComponentSpec("model", "diffusers.DDIMScheduler")]
    optional_components = ("model",)
    inputs = [InputParam("x", type_hint=int, required=True)]
    intermediate_outputs = [OutputParam("y", type_hint=int)]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.y = block_state.x if components.model is None else 2 * block_state.x
        self.set_block_state(state, block_state)
        return components, state


class NeedsModel(UsesOptionalModel):
    """The same step, which cannot run without `model`."""

    optional_components = ()


LISTED = ["diffusers", "DDIMScheduler"]  # an entry the repo could load (its folder is never read here)


def _repo(folder, entry):
    """`folder` with a classic index that lists `model` as `entry` (None: not listed at all)."""
    folder.mkdir(parents=True, exist_ok=True)
    index = {"_class_name": "ToyPipeline", "_diffusers_version": "0.35.0"}
    if entry is not None:
        index["model"] = entry
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def test_a_null_entry_or_none_is_recorded_as_absent(tmp_path):
    """A [null, null] entry, and in a classic index no entry (as diffusers' loading reads it), is an absent
    component; an entry naming a class is only not loaded yet."""
    null = UsesOptionalModel().init_pipeline(_repo(tmp_path / "null", [None, None]))
    unlisted = UsesOptionalModel().init_pipeline(_repo(tmp_path / "unlisted", None))
    listed = UsesOptionalModel().init_pipeline(_repo(tmp_path / "listed", LISTED))
    assert null.absent_component_names == unlisted.absent_component_names == ["model"]
    assert listed.absent_component_names == []
    assert (
        null.null_component_names == unlisted.null_component_names == listed.null_component_names == ["model"]
    )


def test_an_optional_absent_component_is_planned_without(tmp_path):
    """The block runs without the absent model, and the plan's uses leave it out."""
    pipe = UsesOptionalModel().init_pipeline(_repo(tmp_path, [None, None]))
    assert pipe(x=3, output="y") == 3
    plan = plan_call(pipe.blocks, {"x"}, pipe.components, frozenset(pipe.absent_component_names))
    assert plan.component_uses == ()


def test_a_component_not_loaded_yet_is_still_an_error(tmp_path):
    """With an entry naming a class the same block refuses to run: the model is only not loaded, not absent."""
    pipe = UsesOptionalModel().init_pipeline(_repo(tmp_path, LISTED))
    with pytest.raises(ComponentNotLoadedError, match="needs component 'model', which is not loaded"):
        pipe(x=3, output="y")


def test_an_unlisted_component_is_planned_without_or_asked_to_be_loaded(tmp_path):
    """A component a classic index does not list: a block that can run without it does (older Wan 2.1 repos
    predate transformer_2); one that needs it is told to load it, as for any component not loaded."""
    repo = _repo(tmp_path, None)
    assert UsesOptionalModel().init_pipeline(repo)(x=3, output="y") == 3
    with pytest.raises(ComponentNotLoadedError, match="needs component 'model', which is not loaded"):
        NeedsModel().init_pipeline(repo)(x=3, output="y")


def test_a_block_that_needs_an_absent_component_names_the_repo(tmp_path):
    """A block without the component in its optional_components says the repo has none, and how to give one."""
    pipe = NeedsModel().init_pipeline(_repo(tmp_path, [None, None]))
    with pytest.raises(ComponentNotLoadedError) as error:
        pipe(x=3, output="y")
    assert str(error.value) == (
        "block '' (NeedsModel) needs component 'model', which this repo does not have (its index lists 'model' "
        "as [null, null]); give the pipeline one with pipe.update_components(model=...), or use a repo that has it"
    )


def test_a_given_component_is_no_longer_absent(tmp_path):
    """update_components with a model ends its absence: the plan uses it and the block runs with it."""
    pipe = UsesOptionalModel().init_pipeline(_repo(tmp_path, [None, None]))
    pipe.update_components(model=DDIMScheduler())
    assert pipe.absent_component_names == []
    assert pipe(x=3, output="y") == 6
    plan = plan_call(pipe.blocks, {"x"}, pipe.components, frozenset(pipe.absent_component_names))
    assert plan.component_uses == ("model",)


def test_a_saved_pipeline_keeps_the_absence(tmp_path):
    """Saved (a modular index: an entry with no repo to load from) and read back, the component stays absent."""
    pipe = UsesOptionalModel().init_pipeline(_repo(tmp_path / "repo", [None, None]))
    pipe.save_pretrained(tmp_path / "saved")
    again = UsesOptionalModel().init_pipeline(tmp_path / "saved")
    assert again.absent_component_names == ["model"]
    assert again(x=3, output="y") == 3
