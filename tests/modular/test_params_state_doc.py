"""InputParam/OutputParam, PipelineState/BlockState and the generated docs."""

import dataclasses

import attrs
import pytest
import torch

from modular import BlockState, InputParam, OutputParam, PipelineState

from .test_selection import Pipeline
from .toy_blocks import AddOneThenDouble


def test_templates_fill_common_inputs_and_accept_overrides():
    """InputParam.template gives the common description and type; overrides win."""
    param = InputParam.template("num_inference_steps", default=2)
    assert param.name == "num_inference_steps" and param.default == 2 and param.type_hint is int
    assert OutputParam.template("images").name == "images"


def test_unknown_template_lists_the_known_ones():
    """An unknown template name raises a KeyError listing the known ones."""
    with pytest.raises(KeyError, match="unknown template 'nope'"):
        InputParam.template("nope")


def test_param_names_must_be_identifiers():
    """A name that is not an identifier is refused; a nameless param needs a kwargs_type."""
    with pytest.raises(ValueError, match=r"name must be a Python identifier \(got 'a b'\)"):
        InputParam("a b")
    with pytest.raises(ValueError, match="must set kwargs_type"):
        InputParam(None)
    assert InputParam(None, kwargs_type="denoiser_input_fields").kwargs_type == "denoiser_input_fields"


def test_params_are_frozen():
    """Params cannot be changed in place."""
    import attrs

    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        InputParam("x").name = "y"


def test_state_groups_values_by_kwargs_type():
    """PipelineState.get_by_kwargs returns every value tagged with the group."""
    state = PipelineState()
    state.set("prompt_embeds", 1, "denoiser_input_fields")
    state.set("negative_prompt_embeds", 2, "denoiser_input_fields")
    state.set("other", 3)
    assert state.get_by_kwargs("denoiser_input_fields") == {"prompt_embeds": 1, "negative_prompt_embeds": 2}
    assert state.get(["other", "missing"], default=0) == {"other": 3, "missing": 0}


def test_state_attribute_for_a_missing_key_is_an_error():
    """A missing key read as an attribute raises AttributeError listing what exists (never None)."""
    state = PipelineState()
    state.set("a", 1)
    with pytest.raises(AttributeError, match=r"no value 'b'; it holds: \['a'\]"):
        state.b  # noqa: B018


def test_reprs_summarize_tensors():
    """State reprs show tensors as dtype and shape."""
    state = PipelineState()
    state.set("latents", torch.zeros(1, 4, 8, 8))
    assert "latents: Tensor(dtype=torch.float32, shape=(1, 4, 8, 8))" in repr(state)
    assert "x: Tensor(dtype=torch.int64, shape=(3,))" in repr(BlockState(x=torch.arange(3)))


def test_doc_lists_inputs_outputs_and_workflows():
    """doc shows inputs with types and defaults, outputs and workflows."""
    doc = Pipeline().doc
    assert "class Pipeline" in doc
    assert "    x (int, required): a number" in doc
    assert "    scale (int, default: 2)" in doc
    assert "  Workflows:\n    negate: x, flip\n    double: x" in doc
    assert "  Outputs:\n    y (int)\n    z (int)" in doc


def test_repr_shows_the_tree():
    """repr shows nested blocks with their names and branch triggers."""
    text = repr(Pipeline())
    assert text.splitlines()[0].startswith("Pipeline [SequentialPipelineBlocks]")
    assert "  branch: DoubleOrNegate [AutoPipelineBlocks]" in text
    assert "    negate (when flip given): Negate" in text
    assert "    double (default): Double" in text
    assert repr(AddOneThenDouble()).count("\n") == 2


def test_params_are_dataclasses_to_code_written_for_the_peer():
    """The peer's params are dataclasses: dataclasses.replace, fields and asdict work on ours, and replace
    checks what the constructor checks while the original stays as it was."""
    param = InputParam("strength", type_hint=float, default=0.3)
    changed = dataclasses.replace(param, default=None, defaults_by_block={"img2img": 0.3})
    assert changed == InputParam("strength", type_hint=float, defaults_by_block={"img2img": 0.3})
    assert param.default == 0.3 and param.defaults_by_block is None
    assert [f.name for f in dataclasses.fields(InputParam)] == [a.name for a in attrs.fields(InputParam)]
    assert dataclasses.asdict(OutputParam("images", description="the images"))["description"] == "the images"
    with pytest.raises(ValueError, match=r"name must be a Python identifier \(got 'a b'\)"):
        dataclasses.replace(param, name="a b")
    with pytest.raises(TypeError, match="strenght"):
        dataclasses.replace(param, strenght=1.0)
