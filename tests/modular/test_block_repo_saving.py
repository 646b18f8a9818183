"""block.save_pretrained: a block class's code and config, loaded back here and by the peer."""

import json
import sys

import attrs
import pytest
import torch

from modular import BlockRepoError, ModularPipelineBlocks, SequentialPipelineBlocks

from .block_repos import write_repo

USER_MODULE = '''
"""A user's block module (our imports), with a helper next to it."""

import torch

from modular import InputParam, ModularPipelineBlocks, OutputParam

from .user_helpers import offset


class OffsetStep(ModularPipelineBlocks):
    _requirements = {"torch": ">=2.0"}

    @property
    def description(self):
        return "Adds an offset to x"

    @property
    def inputs(self):
        return [InputParam("x", required=True, type_hint=torch.Tensor), InputParam("by", default=1.0, type_hint=float)]

    @property
    def intermediate_outputs(self):
        return [OutputParam("y", type_hint=torch.Tensor, description="x plus the offset")]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.y = offset(block_state.x, block_state.by)
        self.set_block_state(state, block_state)
        return components, state
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """The package `userpkg` with the module `userpkg.user_block`, importable for this test."""
    package = tmp_path / "src" / "userpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "user_block.py").write_text(USER_MODULE)
    (package / "user_helpers.py").write_text("def offset(x, by):\n    return x + by\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    yield __import__("userpkg.user_block", fromlist=["OffsetStep"])
    for name in ("userpkg", "userpkg.user_block", "userpkg.user_helpers"):
        sys.modules.pop(name, None)


def test_save_pretrained_round_trips_a_users_block(tmp_path, user_module):
    """save_pretrained writes the module, its relative imports and the config; loading gives the same block."""
    block = user_module.OffsetStep()
    block.save_pretrained(tmp_path / "saved")
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == [
        "modular_config.json",
        "user_block.py",
        "user_helpers.py",
    ]
    config = json.loads((tmp_path / "saved" / "modular_config.json").read_text())
    assert config["auto_map"] == {"ModularPipelineBlocks": "user_block.OffsetStep"}
    assert config["requirements"] == {"torch": ">=2.0"}
    loaded = ModularPipelineBlocks.from_pretrained(tmp_path / "saved", trust_remote_code=True)
    assert type(loaded) is not type(block)
    assert (loaded.doc, loaded.inputs, loaded.intermediate_outputs) == (
        block.doc,
        block.inputs,
        block.intermediate_outputs,
    )
    x = torch.arange(3.0)
    pipe = SequentialPipelineBlocks.from_blocks_dict({"offset": loaded}).init_pipeline()
    assert torch.equal(pipe(x=x, by=2.0, output="y"), x + 2.0)


def test_a_loaded_block_saves_and_loads_again(tmp_path):
    """A block loaded from a repo saves its own code back out: same doc, inputs, outputs and components."""
    first = ModularPipelineBlocks.from_pretrained(write_repo(tmp_path / "a"), trust_remote_code=True)
    first.save_pretrained(tmp_path / "b")
    second = ModularPipelineBlocks.from_pretrained(tmp_path / "b", trust_remote_code=True)
    assert (tmp_path / "b" / "block.py").read_bytes() == (tmp_path / "a" / "block.py").read_bytes()
    assert second.doc == first.doc
    assert (second.inputs, second.intermediate_outputs) == (first.inputs, first.intermediate_outputs)
    # The component classes are each load's own (the modules differ by content hash); all else is equal.
    assert [attrs.evolve(spec, type_hint=None) for spec in second.expected_components] == [
        attrs.evolve(spec, type_hint=None) for spec in first.expected_components
    ]
    assert second.expected_components[0].type_hint.__qualname__ == "UnsharpMask"
    first.save_pretrained(tmp_path / "a")  # into its own folder: the code is left as it is
    assert ModularPipelineBlocks.from_pretrained(tmp_path / "a", trust_remote_code=True).doc == first.doc


def test_save_refuses_a_class_without_a_module_file(tmp_path):
    """A class from __main__, exec'd code, or a function body cannot be saved: the error says where to move it."""
    for module_name in ("__main__", "not_a_real_module"):
        namespace = {"__name__": module_name, "ModularPipelineBlocks": ModularPipelineBlocks}
        exec("class Interactive(ModularPipelineBlocks):\n    pass\n", namespace)
        with pytest.raises(
            BlockRepoError, match=rf"defined in '{module_name}', which has no module file to copy"
        ):
            namespace["Interactive"]().save_pretrained(tmp_path / "out")

    class Local(ModularPipelineBlocks):
        pass

    with pytest.raises(BlockRepoError, match=r"does not define it at top level as 'Local'"):
        Local().save_pretrained(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_save_refuses_a_relative_import_from_above_its_folder(tmp_path, monkeypatch):
    """`from ..common import f` cannot be copied next to the module: refused, nothing written."""
    package = tmp_path / "src" / "deep"
    (package / "steps").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "common.py").write_text("F = 1\n")
    (package / "steps" / "__init__.py").write_text("")
    (package / "steps" / "step.py").write_text(
        "from modular import ModularPipelineBlocks\n\nfrom ..common import F\n\n\nclass Step(ModularPipelineBlocks):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    try:
        from deep.steps.step import Step

        with pytest.raises(
            BlockRepoError, match=r"step.py line 3 \('from \.\.common import \.\.\.'\) imports from above"
        ):
            Step().save_pretrained(tmp_path / "out")
    finally:
        for name in ("deep", "deep.common", "deep.steps", "deep.steps.step"):
            sys.modules.pop(name, None)
    assert not (tmp_path / "out").exists()


def test_the_peer_loads_what_we_save(tmp_path, monkeypatch):
    """diffusers' own from_pretrained loads a block we saved: a peer block for peer-style code."""
    import diffusers.modular_pipelines as peer
    from diffusers.utils import dynamic_modules_utils

    monkeypatch.syspath_prepend(str(tmp_path))  # sys.path is restored: the peer appends its module cache
    monkeypatch.setattr(dynamic_modules_utils, "HF_MODULES_CACHE", str(tmp_path / "peer-modules"))
    ours = ModularPipelineBlocks.from_pretrained(write_repo(tmp_path / "repo"), trust_remote_code=True)
    ours.save_pretrained(tmp_path / "saved")
    theirs = peer.ModularPipelineBlocks.from_pretrained(str(tmp_path / "saved"), trust_remote_code=True)
    assert isinstance(theirs, peer.ModularPipelineBlocks)
    assert [p.name for p in theirs.inputs] == [p.name for p in ours.inputs]
    assert [p.name for p in theirs.intermediate_outputs] == ["images"]
    assert theirs.description == ours.description
