"""What diffusers' own modular tests check, written as our tests (conditional blocks, branch defaults,
kwargs_type groups, load_components' keep rule, workflows that round-trip, single-file checkpoints).

Deliberate differences from the peer are listed in docs/migrating.md.
"""

import json

import pytest
import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from safetensors.torch import save_file

from blocks.stable_diffusion import make_tiny_repo
from components import ComponentsManager, ComponentSpec, PickleWeightsError
from components.errors import ComponentLoadError
from modular import (
    AutoPipelineBlocks,
    ConditionalPipelineBlocks,
    InputParam,
    ModularPipeline,
    ModularPipelineBlocks,
    OutputParam,
    SequentialPipelineBlocks,
)
from modular.errors import BlockCompositionError, InputTypeError, UnknownInputError


def workflow_block(name, extra_inputs=()):
    """A leaf that records which workflow ran and the strength it saw."""

    class Workflow(ModularPipelineBlocks):
        @property
        def inputs(self):
            return [InputParam("prompt"), *extra_inputs]

        @property
        def intermediate_outputs(self):
            return [OutputParam("workflow"), OutputParam("used_strength")]

        def __call__(self, components, state):
            block_state = self.get_block_state(state)
            block_state.workflow = name
            block_state.used_strength = getattr(block_state, "strength", None)
            self.set_block_state(state, block_state)
            return components, state

    Workflow.__name__ = f"{name.title()}Block"
    return Workflow


TextToImage = workflow_block("text2img")
ImageToImage = workflow_block(
    "img2img", [InputParam("image"), InputParam("strength", type_hint=float, default=0.3)]
)
Inpaint = workflow_block(
    "inpaint",
    [InputParam("image"), InputParam("mask"), InputParam("strength", type_hint=float, default=0.9999)],
)


class WithDefault(ConditionalPipelineBlocks):
    """inpaint on mask, img2img on image, else the default text2img."""

    block_classes = [Inpaint, ImageToImage, TextToImage]
    block_names = ["inpaint", "img2img", "text2img"]
    block_trigger_inputs = ["mask", "image"]
    default_block_name = "text2img"

    def select_block(self, mask=None, image=None):
        if mask is not None:
            return "inpaint"
        if image is not None:
            return "img2img"
        return None


class Skippable(WithDefault):
    """Like WithDefault without a default: None skips."""

    block_classes = [Inpaint, ImageToImage]
    block_names = ["inpaint", "img2img"]
    default_block_name = None


class Auto(AutoPipelineBlocks):
    """The same choice written with triggers."""

    block_classes = [Inpaint, ImageToImage, TextToImage]
    block_names = ["inpaint", "img2img", "text2img"]
    block_trigger_inputs = ["mask", "image", None]


class Nested(ConditionalPipelineBlocks):
    """refine on mask, else the Auto blocks (the default)."""

    block_classes = [Inpaint, Auto]
    block_names = ["refine", "image"]
    block_trigger_inputs = ["mask"]
    default_block_name = "image"

    def select_block(self, mask=None):
        return "refine" if mask is not None else None


# ----- conditional blocks: None runs the default -----


def test_none_runs_the_default_branch():
    """select_block returning None runs default_block_name's branch: in the run, the plan and get_execution_blocks."""
    blocks = WithDefault()
    assert blocks.select_block() is None
    assert isinstance(blocks.get_execution_blocks(), TextToImage)
    assert [step.path for step in blocks.execution_steps({"prompt"})] == [("text2img",)]
    assert blocks.init_pipeline()(prompt="p", output="workflow") == "text2img"


@pytest.mark.parametrize(
    ("given", "expected"),
    [({"mask": 1}, Inpaint), ({"image": 1}, ImageToImage), ({"mask": 1, "image": 1}, Inpaint)],
    ids=["mask", "image", "both"],
)
def test_triggers_choose_their_branch(given, expected):
    """A trigger that select_block answers picks its branch, with or without a default."""
    assert isinstance(WithDefault().get_execution_blocks(**given), expected)
    assert isinstance(Auto().get_execution_blocks(**given), expected)


def test_none_without_a_default_skips():
    """With no default_block_name, None runs nothing, and its inputs are not required."""
    blocks = Skippable()
    assert blocks.get_execution_blocks() is None
    assert blocks.execution_steps({"prompt"}) == []
    assert isinstance(blocks.get_execution_blocks(image=1), ImageToImage)
    assert not any(param.required for param in blocks.inputs)


def test_the_docs_list_the_default_branch_steps():
    """A workflow chosen by the default branch shows its steps in the docs."""

    class WithWorkflows(SequentialPipelineBlocks):
        block_classes = [WithDefault]
        block_names = ["branch"]
        _workflow_map = {"text": {"prompt": True}}

    assert "    text: text2img" in WithWorkflows().doc


def test_a_default_that_is_no_sub_block_is_refused():
    """default_block_name must name a sub-block; the error lists them."""

    class Wrong(WithDefault):
        default_block_name = "txt2img"

    with pytest.raises(
        BlockCompositionError, match=r"default_block_name 'txt2img' is not a sub-block; sub-blocks"
    ):
        Wrong()


def test_structure_is_readable():
    """sub_blocks holds the named children; description is the class's."""
    blocks = WithDefault()
    assert {name: type(block) for name, block in blocks.sub_blocks.items()} == {
        "inpaint": Inpaint,
        "img2img": ImageToImage,
        "text2img": TextToImage,
    }
    assert blocks.description == "inpaint on mask, img2img on image, else the default text2img."


# ----- defaults that differ by branch -----


def test_branch_defaults_are_recorded_per_block():
    """Branches that disagree on a default: the composed input's default is None, each branch's is recorded."""
    [strength] = [p for p in Auto().inputs if p.name == "strength"]
    assert strength == InputParam(
        "strength", type_hint=float, default=None, defaults_by_block={"inpaint": 0.9999, "img2img": 0.3}
    )


def test_a_none_default_counts_as_a_disagreement():
    """A branch without a default (None) and one with 5 disagree; agreeing branches record nothing."""
    a = workflow_block("a", [InputParam("x"), InputParam("y", default=1)])
    b = workflow_block("b", [InputParam("x", default=5), InputParam("y", default=1)])

    class Choice(ConditionalPipelineBlocks):
        block_classes = [a, b]
        block_names = ["a", "b"]
        block_trigger_inputs = ["x"]

    params = {p.name: p for p in Choice().inputs}
    assert params["x"].defaults_by_block == {"a": None, "b": 5}
    assert params["y"].defaults_by_block is None and params["y"].default == 1


def test_nested_branch_defaults_are_keyed_by_path():
    """A nested choice's per-branch defaults are prefixed with its name; the docs show each distinct value
    once, with the paths that use it (the peer shows distinct values only)."""
    [strength] = [p for p in Nested().inputs if p.name == "strength"]
    assert strength.defaults_by_block == {"refine": 0.9999, "image.inpaint": 0.9999, "image.img2img": 0.3}
    doc_line = next(line for line in Nested().doc.splitlines() if line.strip().startswith("strength"))
    assert (
        doc_line
        == "    strength (float, default by branch: 0.9999 (refine, image.inpaint), 0.3 (image.img2img))"
    )


def test_a_sequence_keeps_the_paths_of_a_choice_inside_it():
    """A choice inside a sequence: the per-branch defaults are keyed by their path from the sequence."""
    blocks = SequentialPipelineBlocks.from_blocks_dict({"choose": Auto})
    [strength] = [p for p in blocks.inputs if p.name == "strength"]
    assert strength.defaults_by_block == {"choose.inpaint": 0.9999, "choose.img2img": 0.3}


def test_each_branch_applies_its_own_default():
    """The branch that runs uses its own default; a given value wins; a lone branch keeps its default."""
    pipe = Auto().init_pipeline()
    assert pipe(prompt="p", image="i", output="used_strength") == 0.3
    assert pipe(prompt="p", image="i", mask="m", output="used_strength") == 0.9999
    assert pipe(prompt="p", image="i", strength=0.7, output="used_strength") == 0.7
    assert ImageToImage().init_pipeline()(prompt="p", image="i", output="used_strength") == 0.3


# ----- inputs grouped by kwargs_type -----


class Producer(ModularPipelineBlocks):
    """Passes a and b through; writes a tagged 'group', b untagged."""

    @property
    def inputs(self):
        return [InputParam("a"), InputParam("b")]

    @property
    def intermediate_outputs(self):
        return [OutputParam("a", kwargs_type="group"), OutputParam("b")]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.a, block_state.b = f"{block_state.a}-made", f"{block_state.b}-made"
        self.set_block_state(state, block_state)
        return components, state


class Consumer(ModularPipelineBlocks):
    """Reads the 'group' values as one dict, and b by name."""

    @property
    def inputs(self):
        return [InputParam(kwargs_type="group"), InputParam("b"), InputParam("c", type_hint=int)]

    @property
    def intermediate_outputs(self):
        return [OutputParam("received")]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.received = (block_state.group, getattr(block_state, "a", None), block_state.b)
        self.set_block_state(state, block_state)
        return components, state


def test_tagged_outputs_reach_the_group_reader():
    """An output tagged with a kwargs_type reaches the block that reads the group; an untagged one only by name."""
    pipe = SequentialPipelineBlocks.from_blocks_dict({"make": Producer, "use": Consumer}).init_pipeline()
    assert pipe(a="x", b="y", output="received") == ({"a": "x-made"}, "x-made", "y-made")


def test_a_group_can_be_passed_as_one_dict():
    """pipe(group={...}) tags every entry with the group, as the peer does."""
    pipe = Consumer().init_pipeline()
    state = pipe(group={"a": "x", "c": 3}, b="y")
    assert state.get("received") == ({"a": "x", "c": 3}, "x", "y")
    assert state.kwargs_mapping["group"] == ["a", "c"]


def test_the_group_is_a_documented_input():
    """The group shows as one nameless input, rendered **group in the docs."""
    blocks = SequentialPipelineBlocks.from_blocks_dict({"make": Producer, "use": Consumer})
    assert [p.name for p in blocks.inputs if p.name] == ["a", "b", "c"]
    assert [p.kwargs_type for p in blocks.inputs if p.name is None] == ["group"]
    assert "**group" in blocks.doc


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (
            "x",
            InputTypeError,
            r"input 'group' is a group of inputs \(kwargs_type 'group'\) and must be a dict",
        ),
        ({"not an id": 1}, InputTypeError, r"must be a dict of input names to values"),
        ({"c": "three"}, InputTypeError, r"input 'c' in group must be int \(got 'three' that is a str\)"),
        ({"b": "twice"}, TypeError, r"got multiple values for input\(s\) \['b'\]: by name and inside group"),
    ],
    ids=["not-a-dict", "bad-key", "bad-type", "twice"],
)
def test_a_bad_group_is_refused_before_anything_runs(value, error, message):
    """A group that is not a dict of names, a member of the wrong type, or a member also given by name."""
    pipe = Consumer().init_pipeline()
    with pytest.raises(error, match=message):
        pipe(group=value, b="by name")


def test_a_misspelt_group_is_an_unknown_input():
    """A group name no block reads is refused like any unknown input, with the closest name."""
    with pytest.raises(UnknownInputError, match=r"unknown input 'grop'; did you mean 'group'\?"):
        Consumer().init_pipeline()(grop={"a": 1})


# ----- load_components keeps what is loaded -----


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory):
    return make_tiny_repo(tmp_path_factory.mktemp("peer") / "tiny-sd")


def test_a_second_load_keeps_loaded_components(tiny_repo):
    """load_components() again loads nothing that is loaded: the objects stay the same."""
    pipe = ModularPipeline.from_pretrained(tiny_repo)
    pipe.load_components(torch_dtype=torch.float32)
    before = pipe.components
    pipe.load_components()
    assert all(pipe.components[name] is obj for name, obj in before.items())


def test_loading_is_selective_and_incremental(tiny_repo):
    """Named components load alone; a second call adds to them."""
    pipe = ModularPipeline.from_pretrained(tiny_repo)
    pipe.load_components("unet")
    assert pipe.unet is not None and pipe.vae is None
    unet = pipe.unet
    pipe.load_components(["vae"])
    assert pipe.unet is unet and pipe.vae is not None


def test_a_component_set_by_hand_is_kept(tiny_repo):
    """update_components(unet=mine) survives a bare load_components(), load ID or not."""
    pipe = ModularPipeline.from_pretrained(tiny_repo)
    mine = UNet2DConditionModel.from_pretrained(
        tiny_repo, subfolder="unet"
    )  # diffusers' load: carries a load ID
    pipe.update_components(unet=mine)
    pipe.load_components()
    assert pipe.unet is mine
    untagged = UNet2DConditionModel.from_config(mine.config)
    pipe.update_components(unet=untagged)
    pipe.load_components()
    assert pipe.unet is untagged


def test_a_named_or_changed_component_is_reloaded(tiny_repo, tmp_path):
    """Naming a component reloads it; so does a bare call whose loading fields change its spec."""
    other = make_tiny_repo(tmp_path / "other", seed=7)
    pipe = ModularPipeline.from_pretrained(tiny_repo)
    pipe.load_components()
    vae, unet = pipe.vae, pipe.unet
    pipe.load_components("vae")
    assert pipe.vae is not vae
    pipe.load_components(pretrained_model_name_or_path={"unet": str(other)})
    assert pipe.unet is not unet and pipe.unet._diffusers_load_id == f"{other}|unet|null|null"


def test_a_component_without_a_repo_is_skipped(tiny_repo):
    """A from_pretrained spec with no repo is not loaded by a bare call (and is no error)."""

    class Extra(ModularPipelineBlocks):
        @property
        def expected_components(self):
            return [ComponentSpec("extra", torch.nn.Module), ComponentSpec("vae", AutoencoderKL)]

        def __call__(self, components, state):
            return components, state

    pipe = Extra().init_pipeline(tiny_repo)
    pipe.load_components()
    assert pipe.extra is None and pipe.vae is not None


def test_load_components_of_one_workflow(tiny_repo):
    """load_components(workflow=...) loads what that workflow's blocks use, as a pipeline of those blocks
    would; with names too it is a ValueError, and an unknown workflow one that lists the workflows."""
    pipe = ModularPipeline.from_pretrained(tiny_repo)
    pipe.load_components(workflow="text2image")
    ref = pipe.blocks.get_workflow("text2image").init_pipeline(tiny_repo)
    ref.load_components()
    loaded = {name for name in pipe.pretrained_component_names if pipe.components[name] is not None}
    assert loaded == {name for name in ref.pretrained_component_names if ref.components[name] is not None}
    assert loaded
    with pytest.raises(ValueError, match="not both"):
        pipe.load_components(names="unet", workflow="text2image")
    with pytest.raises(ValueError, match=r"Available workflows: \['text2image', "):
        pipe.load_components(workflow="nope")


def test_default_call_parameters_name_each_input_with_its_default(tiny_repo):
    """The peer's pipe.default_call_parameters: every named input of the blocks and its default."""
    pipe = ModularPipeline.from_pretrained(tiny_repo)
    defaults = pipe.default_call_parameters
    assert defaults == {param.name: param.default for param in pipe.blocks.inputs if param.name}
    assert {"num_inference_steps", "num_images_per_prompt", "latents", "output_type"} <= set(defaults)
    assert defaults["num_inference_steps"] == 50


# ----- a workflow's pipeline round-trips -----


def test_a_workflow_pipeline_round_trips(tiny_repo, tmp_path):
    """get_workflow + init_pipeline, saved, reopens with from_pretrained as the same steps and outputs."""
    full = ModularPipeline.from_pretrained(tiny_repo)
    t2i = full.blocks.get_workflow("text2image").init_pipeline(tiny_repo)
    t2i.load_components(torch_dtype=torch.float32)
    t2i.save_pretrained(tmp_path / "saved")
    index = json.loads((tmp_path / "saved" / "modular_model_index.json").read_text())
    assert (index["_blocks_class_name"], index["_workflow"]) == (full.blocks_class_name, "text2image")
    loaded = ModularPipeline.from_pretrained(tmp_path / "saved")
    loaded.load_components(torch_dtype=torch.float32)
    assert [(n, type(b)) for n, b in loaded.blocks.sub_blocks.items()] == [
        (n, type(b)) for n, b in t2i.blocks.sub_blocks.items()
    ]
    outputs = []
    for pipe in (t2i, loaded):
        pipe.set_progress_bar_config(disable=True)
        generator = torch.Generator().manual_seed(0)
        outputs.append(
            pipe(
                prompt="a cat", num_inference_steps=2, generator=generator, output_type="pt", output="images"
            )
        )
    assert torch.equal(outputs[0], outputs[1])


# ----- single-file checkpoints -----


@pytest.mark.parametrize(("cls", "subfolder"), [(UNet2DConditionModel, "unet"), (AutoencoderKL, "vae")])
def test_a_single_file_loads_through_from_single_file(tiny_repo, tmp_path, cls, subfolder):
    """A spec whose repo is one .safetensors file loads it (diffusers layout, config= the model's folder)."""
    model = cls.from_pretrained(tiny_repo, subfolder=subfolder)
    path = tmp_path / f"{subfolder}.safetensors"
    save_file(model.state_dict(), path)
    spec = ComponentSpec(subfolder, cls, repo=str(path))
    loaded = spec.load(config=str(tiny_repo / subfolder), torch_dtype=torch.float32)
    assert loaded._diffusers_load_id == f"{path}||null|null"
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


def test_load_components_loads_a_single_file_through_the_manager(tiny_repo, tmp_path):
    """load_components with a file as the repo registers it under its file's load ID, and reuses it."""
    model = UNet2DConditionModel.from_pretrained(tiny_repo, subfolder="unet")
    path = tmp_path / "unet.safetensors"
    save_file(model.state_dict(), path)
    cm = ComponentsManager()
    pipes = [ModularPipeline.from_pretrained(tiny_repo, components_manager=cm) for _ in range(2)]
    for pipe in pipes:
        # The index's subfolder ("unet") is the config's, inside config=.
        pipe.load_components("unet", pretrained_model_name_or_path=str(path), config=str(tiny_repo))
    assert pipes[0].unet is pipes[1].unet
    assert pipes[0].unet._diffusers_load_id == f"{path}|unet|null|null"
    assert pipes[0].get_component_spec("unet").pretrained_model_name_or_path == str(path)
    assert all(
        torch.equal(a, b) for a, b in zip(pipes[0].unet.state_dict().values(), model.state_dict().values())
    )


def test_a_pickle_checkpoint_needs_use_pickle(tiny_repo, tmp_path):
    """A .ckpt file is refused without use_pickle=True, before it is opened; with it, it loads."""
    model = AutoencoderKL.from_pretrained(tiny_repo, subfolder="vae")
    path = tmp_path / "vae.ckpt"
    torch.save(model.state_dict(), path)
    spec = ComponentSpec("vae", AutoencoderKL, repo=str(path))
    with pytest.raises(
        PickleWeightsError, match=r"single file '.*vae.ckpt' of component 'vae' is a pickle file"
    ):
        spec.load(config=str(tiny_repo / "vae"))
    assert isinstance(spec.load(config=str(tiny_repo / "vae"), use_pickle=True), AutoencoderKL)


@pytest.mark.parametrize(
    ("spec_kwargs", "message"),
    [
        ({"type_hint": None}, r"does not say which class it holds; give the spec a type_hint"),
        (
            {"type_hint": torch.nn.Linear},
            r"declared as torch.nn.modules.linear.Linear, which has no from_single_file",
        ),
        (
            {"type_hint": AutoencoderKL, "subfolder": "vae"},
            r"has \{'subfolder': 'vae'\}, which a single checkpoint",
        ),
        (
            {"type_hint": AutoencoderKL, "variant": "fp16"},
            r"has \{'variant': 'fp16'\}, which a single checkpoint",
        ),
    ],
    ids=["no-type", "no-single-file-support", "subfolder-without-config", "variant"],
)
def test_a_single_file_spec_that_cannot_load_says_why(tmp_path, spec_kwargs, message):
    """No class, a class without from_single_file, or a subfolder on a file: a clear error naming the file."""
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(1)}, path)
    with pytest.raises(ComponentLoadError, match=message):
        ComponentSpec("vae", repo=str(path), **spec_kwargs).load()


def test_config_is_only_for_single_files(tiny_repo):
    """config= with a folder repo is an error that says what it is for."""
    with pytest.raises(ValueError, match=r"config= names the config of a single checkpoint file"):
        ComponentSpec("vae", AutoencoderKL, repo=str(tiny_repo), subfolder="vae").load(config="x")


# ----- the manager: registry and auto offload -----

UNIT = 1024


class Sized(torch.nn.Module):
    """A model of ``nbytes`` float32 bytes."""

    def __init__(self, nbytes=UNIT):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(nbytes // 4))

    def forward(self, x):
        return x + self.weight.sum()


def test_the_registry_adds_finds_and_removes():
    """add returns an id (the same for the same object), get_one finds by name or id, remove drops it."""
    cm = ComponentsManager()
    model = Sized()
    component_id = cm.add("unet", model)
    assert cm.add("unet", model) == component_id and len(cm.components) == 1
    assert cm.get_one(name="unet") is model and cm.get_one(component_id=component_id) is model
    assert cm.get_model_info(component_id, fields="size_gb") == {"size_gb": UNIT / 1024**3}
    cm.remove(component_id)
    assert component_id not in cm.components


def test_auto_offload_evicts_only_under_pressure():
    """Models start on the host; with room both stay resident; without, the resident one is evicted."""
    from offload import SimulatedDevice

    for budget, evicted in ((70 * UNIT, ()), (7 * UNIT, ("m1",))):
        cm = ComponentsManager()
        m1, m2 = Sized(4 * UNIT), Sized(4 * UNIT)
        ids = {cm.add("m1", m1): "m1", cm.add("m2", m2): "m2"}
        device = SimulatedDevice(budget)
        cm.enable_auto_cpu_offload(device=device, memory_reserve_margin=0)
        assert device.used_bytes() == 0  # nothing is placed before it runs
        m1(torch.zeros(1))
        m2(torch.zeros(1))
        decisions = [entry for entry in cm.offload_log if ids[entry.model_id] == "m2"]
        assert tuple(ids[v] for v in decisions[-1].evicted) == evicted
        assert device.used_bytes() == (8 if not evicted else 4) * UNIT
        cm.disable_auto_cpu_offload()
