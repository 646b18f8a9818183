"""Blocks shared as repos: loaded from a folder or a hub revision in the peer's layout, run with family blocks."""

import sys

import pytest
import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config

from blocks.stable_diffusion import StableDiffusionAutoBlocks, make_tiny_repo
from modular import (
    BlockSource,
    ComponentsManager,
    ComponentSpec,
    InputParam,
    ModularPipelineBlocks,
    OutputParam,
    SequentialPipelineBlocks,
)
from offload import SimulatedDevice, module_nbytes

from . import block_repos
from .block_repos import DESCRIPTION, PEER_SHARPEN, REPO_ID, write_repo

hub_commits, hub = block_repos.hub_commits, block_repos.hub  # the hub cache fixtures


class UnsharpMask(ConfigMixin):
    """The same component, defined here: the reference the loaded one must equal."""

    config_name = "unsharp_mask.json"

    @register_to_config
    def __init__(self, amount: float = 0.5):
        pass

    def __call__(self, images, amount):
        blurred = F.avg_pool2d(images, 3, stride=1, padding=1, count_include_pad=False)
        return (images + amount * (images - blurred)).clamp(0, 1)


class SharpenImagesStep(ModularPipelineBlocks):
    """The same block, defined here with our imports."""

    expected_components = [
        ComponentSpec(
            "unsharp_mask", UnsharpMask, config={"amount": 0.5}, default_creation_method="from_config"
        )
    ]

    inputs = [InputParam("images", required=True), InputParam("sharpen_amount")]

    intermediate_outputs = [OutputParam("images")]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        amount = block_state.sharpen_amount
        if amount is None:
            amount = components.unsharp_mask.config.amount
        block_state.images = components.unsharp_mask(block_state.images, amount)
        self.set_block_state(state, block_state)
        return components, state


@pytest.fixture(scope="module")
def sd_repo(tmp_path_factory):
    return make_tiny_repo(tmp_path_factory.mktemp("sd") / "tiny-sd")


@pytest.fixture(scope="module")
def cm():
    """One manager for the module's SD pipelines: the tiny weights load once and are reused."""
    return ComponentsManager()


def sharpened_sd(sd_repo, cm, block):
    """The SD blocks with `block` appended after decode, loaded through `cm`."""
    blocks = StableDiffusionAutoBlocks()
    blocks.sub_blocks.insert("sharpen", block, len(blocks.sub_blocks))
    pipe = blocks.init_pipeline(sd_repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run(pipe, **inputs):
    generator = torch.Generator().manual_seed(0)
    return pipe(
        prompt="a cat",
        num_inference_steps=2,
        generator=generator,
        output_type="pt",
        output="images",
        **inputs,
    )


@pytest.fixture(scope="module")
def reference_images(sd_repo, cm):
    """The SD output sharpened by the block class defined in this file."""
    return run(sharpened_sd(sd_repo, cm, SharpenImagesStep()))


def test_peer_block_loads_from_a_folder_as_our_block(tmp_path):
    """A peer-layout folder gives an instance of our ModularPipelineBlocks, its peer imports mapped to ours."""
    import diffusers.modular_pipelines as peer

    folder = write_repo(tmp_path / "sharpen")
    block = ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    assert type(block).__name__ == "SharpenImagesStep"
    assert isinstance(block, ModularPipelineBlocks)
    assert not isinstance(block, peer.ModularPipelineBlocks)
    assert [type(p) for p in block.inputs] == [InputParam, InputParam]
    assert type(block.expected_components[0]) is ComponentSpec
    assert block.description == DESCRIPTION
    assert block.source == BlockSource(
        repo=str(folder),
        revision=None,
        commit=None,
        content_hash=block.source.content_hash,
        code_file="block.py",
        class_name="SharpenImagesStep",
    )
    assert len(block.source.content_hash) == 64


def test_loading_a_peer_block_leaves_diffusers_untouched(tmp_path):
    """The mapping is the loaded module's own: diffusers.modular_pipelines stays the peer's everywhere else."""
    import diffusers
    import diffusers.modular_pipelines as peer

    before = {name: module for name, module in sys.modules.items() if name.startswith("diffusers")}
    ModularPipelineBlocks.from_pretrained(write_repo(tmp_path / "sharpen"), trust_remote_code=True)
    after = {name: module for name, module in sys.modules.items() if name.startswith("diffusers")}
    assert all(after[name] is module for name, module in before.items())
    assert sys.modules["diffusers.modular_pipelines"] is peer
    assert peer.ModularPipelineBlocks.__module__.startswith("diffusers.")
    assert diffusers.ModularPipelineBlocks is peer.ModularPipelineBlocks


def test_every_import_form_of_the_peer_names_gives_ours(tmp_path):
    """`import diffusers.modular_pipelines as mp`, its submodules, top-level diffusers, also inside functions."""
    code = """
    import diffusers
    import diffusers.modular_pipelines
    import diffusers.modular_pipelines as mp
    from diffusers import ModularPipelineBlocks, UNet2DConditionModel
    from diffusers.modular_pipelines.modular_pipeline_utils import InputParam
    from diffusers.modular_pipelines.modular_pipeline import PipelineState, SequentialPipelineBlocks
    import modular

    assert ModularPipelineBlocks is modular.ModularPipelineBlocks
    assert mp.ModularPipelineBlocks is modular.ModularPipelineBlocks
    assert diffusers.modular_pipelines.OutputParam is modular.OutputParam
    assert diffusers.ComponentsManager is modular.ComponentsManager
    assert InputParam is modular.InputParam and PipelineState is modular.PipelineState
    assert SequentialPipelineBlocks is modular.SequentialPipelineBlocks
    assert UNet2DConditionModel.__module__.startswith("diffusers.models")  # the rest of diffusers is real


    class Probe(ModularPipelineBlocks):
        def mapped_at_call_time(self):
            from diffusers.modular_pipelines import ConfigSpec

            return ConfigSpec is modular.ConfigSpec
    """
    config = {"auto_map": {"ModularPipelineBlocks": "block.Probe"}}
    block = ModularPipelineBlocks.from_pretrained(
        write_repo(tmp_path / "probe", code, config), trust_remote_code=True
    )
    assert block.mapped_at_call_time()


def test_relative_imports_are_read_from_the_repo(tmp_path):
    """`from .helpers import f` and `from .pkg.mod import g` load the repo's own files."""
    code = """
    from diffusers.modular_pipelines import ModularPipelineBlocks
    from .helpers import double
    from .pkg.mod import triple
    from . import helpers


    class Arithmetic(ModularPipelineBlocks):
        value = double(triple(1)) + helpers.double(0)
    """
    files = {
        "helpers.py": "def double(x):\n    return 2 * x\n",
        "pkg/mod.py": "from ..helpers import double\n\n\ndef triple(x):\n    return double(x) + x\n",
    }
    folder = write_repo(
        tmp_path / "arith", code, {"auto_map": {"ModularPipelineBlocks": "block.Arithmetic"}}, files
    )
    block = ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    assert block.value == 6


def test_loaded_block_in_the_sd_blocks_equals_the_same_class_defined_here(
    tmp_path, sd_repo, cm, reference_images
):
    """Loaded from a folder and appended to the SD blocks, the block's output equals the in-test class's."""
    block = ModularPipelineBlocks.from_pretrained(write_repo(tmp_path / "sharpen"), trust_remote_code=True)
    pipe = sharpened_sd(sd_repo, cm, block)
    assert torch.equal(run(pipe), reference_images)
    assert cm.get_id(pipe.unsharp_mask) is not None  # its component resolved through the manager
    unsharpened = pipe(
        prompt="a cat",
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        output="images",
        sharpen_amount=0.0,
    )
    assert not torch.equal(unsharpened, reference_images)  # the block did change the images


def test_block_from_the_hub_cache_runs_and_records_the_commit(hub, sd_repo, cm, reference_images):
    """By repo id, the default branch's code runs, and block.source names the repo, revision and commit."""
    block = ModularPipelineBlocks.from_pretrained(REPO_ID, trust_remote_code=True)
    assert (block.source.repo, block.source.revision, block.source.commit) == (REPO_ID, None, hub["main"])
    assert torch.equal(run(sharpened_sd(sd_repo, cm, block)), reference_images)


def test_the_code_comes_from_the_pinned_revision(hub):
    """revision='v2' (or its commit) runs v2's code; main's code is another module."""
    main = ModularPipelineBlocks.from_pretrained(REPO_ID, trust_remote_code=True)
    v2 = ModularPipelineBlocks.from_pretrained(REPO_ID, trust_remote_code=True, revision="v2")
    pinned = ModularPipelineBlocks.from_pretrained(REPO_ID, trust_remote_code=True, revision=hub["v2"])
    assert (v2.source.revision, v2.source.commit) == ("v2", hub["v2"])
    assert v2.description == pinned.description == "Sharpens harder"
    assert v2.expected_components[0].config == {"amount": 2.0}
    assert main.expected_components[0].config == {"amount": 0.5}
    assert type(v2) is type(pinned) and type(v2) is not type(main)  # same content: one module


def test_loaded_block_composes_with_from_blocks_dict_under_auto_offload(tmp_path, sd_repo):
    """A loaded block sits in from_blocks_dict with family blocks; under auto offload outputs stay equal."""
    loaded = ModularPipelineBlocks.from_pretrained(write_repo(tmp_path / "sharpen"), trust_remote_code=True)
    family = StableDiffusionAutoBlocks()
    blocks = SequentialPipelineBlocks.from_blocks_dict({**family.sub_blocks, "sharpen": loaded})
    manager = ComponentsManager()
    pipe = blocks.init_pipeline(sd_repo, components_manager=manager)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    expected = run(pipe)
    budget = module_nbytes(pipe.unet) + module_nbytes(pipe.text_encoder) + 1024
    manager.enable_auto_cpu_offload(device=SimulatedDevice(budget), memory_reserve_margin=0)
    assert torch.equal(run(pipe), expected)
    # Victims left the device, whole or down to a resident prefix (offload.partial.shrink, on by default).
    assert any(entry.evicted or entry.reason == "shrink" for entry in manager.offload_log)
    manager.disable_auto_cpu_offload()


def test_block_kwargs_go_to_the_class(tmp_path):
    """Extra keywords build the block; one its class does not take is a TypeError naming the signature."""
    code = """
    from diffusers.modular_pipelines import ModularPipelineBlocks


    class Scaled(ModularPipelineBlocks):
        def __init__(self, factor=1):
            self.factor = factor
    """
    folder = write_repo(tmp_path / "scaled", code, {"auto_map": {"ModularPipelineBlocks": "block.Scaled"}})
    assert ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True, factor=3).factor == 3
    with pytest.raises(
        TypeError, match=r"Scaled\(factor=1\) does not take the keyword arguments \['facter'\]"
    ):
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True, facter=3)


def test_loads_from_several_threads_run_the_code_once(tmp_path):
    """Concurrent loads of one repo run its code once and give one class."""
    from concurrent.futures import ThreadPoolExecutor

    marker = tmp_path / "runs"
    code = f"with open({str(marker)!r}, 'a') as f:\n    f.write('x')\n" + PEER_SHARPEN.format(
        amount=0.5, description=DESCRIPTION
    )
    folder = write_repo(tmp_path / "repo", code)
    with ThreadPoolExecutor(4) as pool:
        blocks = list(
            pool.map(
                lambda _: ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True), range(8)
            )
        )
    assert len({type(block) for block in blocks}) == 1
    assert marker.read_text() == "x"


def test_a_block_in_a_subfolder_loads_and_records_it(tmp_path):
    """subfolder= picks the block's folder inside a larger repo, and block.source records it."""
    write_repo(tmp_path / "repo" / "blocks" / "sharpen")
    block = ModularPipelineBlocks.from_pretrained(
        tmp_path / "repo", trust_remote_code=True, subfolder="blocks/sharpen"
    )
    assert (block.source.repo, block.source.subfolder) == (str(tmp_path / "repo"), "blocks/sharpen")
    assert block.description == DESCRIPTION
