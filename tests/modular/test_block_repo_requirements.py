"""Requirements of saved blocks: a composed block saves its children's, the save warns about unmet ones."""

import json
import logging
import sys

import pytest

from modular import BlockRepoError, ModularPipelineBlocks, SequentialPipelineBlocks

REQUIRING_MODULE = '''
"""Leaves that declare requirements, and the three composite kinds made of them."""

from modular import (
    ConditionalPipelineBlocks,
    LoopSequentialPipelineBlocks,
    ModularPipelineBlocks,
    SequentialPipelineBlocks,
)


class NeedsTorch(ModularPipelineBlocks):
    _requirements = {"torch": ">=2.0"}


class NeedsTorchBelow99AndPackaging(ModularPipelineBlocks):
    _requirements = {"torch": "<99", "packaging": ">=20"}


class NeedsNothing(ModularPipelineBlocks):
    pass


class InOrder(SequentialPipelineBlocks):
    _requirements = {"numpy": ""}
    block_classes = [NeedsTorch, NeedsTorchBelow99AndPackaging, NeedsNothing]
    block_names = ["torch_step", "packaging_step", "plain_step"]


class OneOf(ConditionalPipelineBlocks):
    block_classes = [NeedsTorch, NeedsTorchBelow99AndPackaging]
    block_names = ["torch_step", "packaging_step"]
    block_trigger_inputs = []

    def select_block(self, **kwargs):
        return "torch_step"


class EachStep(LoopSequentialPipelineBlocks):
    block_classes = [NeedsTorch, NeedsTorchBelow99AndPackaging]
    block_names = ["torch_step", "packaging_step"]


class Nested(SequentialPipelineBlocks):
    block_classes = [OneOf, NeedsNothing]
    block_names = ["choice", "plain_step"]


class Unmet(ModularPipelineBlocks):
    _requirements = {"torch": ">=999", "no-such-package-xyz": ">=1.0"}


class BadSpecifier(ModularPipelineBlocks):
    _requirements = {"torch": "two or later"}


class HasBadChild(SequentialPipelineBlocks):
    block_classes = [NeedsTorch, BadSpecifier]
    block_names = ["fine", "bad"]
'''


@pytest.fixture
def requiring(tmp_path, monkeypatch):
    """The module `requiring_blocks`, importable for this test."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "requiring_blocks.py").write_text(REQUIRING_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    yield __import__("requiring_blocks")
    sys.modules.pop("requiring_blocks", None)


def saved_requirements(folder):
    return json.loads((folder / "modular_config.json").read_text()).get("requirements")


@pytest.mark.parametrize("kind", ["InOrder", "OneOf", "EachStep", "Nested"])
def test_a_composed_block_saves_its_childrens_requirements(tmp_path, requiring, kind):
    """Each kind of composed block saves its own and every descendant's requirements, one entry per package
    (two specifiers of one package joined), and loads back where they hold."""
    getattr(requiring, kind)().save_pretrained(tmp_path / "saved")
    expected = {"torch": "<99,>=2.0", "packaging": ">=20"}
    if kind == "InOrder":
        expected["numpy"] = ""
    assert saved_requirements(tmp_path / "saved") == expected
    loaded = ModularPipelineBlocks.from_pretrained(tmp_path / "saved", trust_remote_code=True)
    assert list(loaded.sub_blocks) == list(getattr(requiring, kind)().sub_blocks)


def test_saving_warns_about_requirements_this_environment_does_not_meet(tmp_path, requiring, caplog):
    """The save writes them (the repo is for where they hold) and one warning names each unmet one."""
    with caplog.at_level(logging.WARNING, logger="modular"):
        requiring.Unmet().save_pretrained(tmp_path / "saved")
    assert saved_requirements(tmp_path / "saved") == {"torch": ">=999", "no-such-package-xyz": ">=1.0"}
    [record] = [r for r in caplog.records if r.name.startswith("modular.")]
    assert record.levelno == logging.WARNING
    assert "Unmet is saved with requirements this environment does not meet: torch>=999 is wanted, " in (
        record.getMessage()
    )
    assert "no-such-package-xyz>=1.0 is not installed" in record.getMessage()


def test_a_bad_specifier_is_refused_at_save_naming_the_block(tmp_path, requiring):
    """A specifier that is not one is refused before anything is written, naming the block that declares it."""
    with pytest.raises(
        BlockRepoError,
        match=r"HasBadChild: block 'bad' \(BadSpecifier\) requires torch 'two or later', which is not a "
        r"version specifier",
    ):
        requiring.HasBadChild().save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()


def test_a_composed_block_without_a_class_of_its_own_is_refused_at_save(tmp_path, requiring):
    """from_blocks_dict's children live in the instance, not in code a repo holds: saving names the fix."""
    blocks = SequentialPipelineBlocks.from_blocks_dict({"torch_step": requiring.NeedsTorch})
    with pytest.raises(
        BlockRepoError,
        match=r"this project's own SequentialPipelineBlocks, made with from_blocks_dict .* Define a class "
        r"of your own in a module: class MyBlocks\(SequentialPipelineBlocks\)",
    ):
        blocks.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()
