"""Block repos refused: each a clear error, with nothing of the repo run or registered."""

import json

import pytest

from components import RepoNotFoundError, RevisionNotFoundError, SubfolderOutsideRepoError
from modular import BlockCodeError, BlockRepoError, ModularPipelineBlocks
from modular.remote import PeerImportError

from . import block_repos
from .block_repos import (
    CONFIG,
    DESCRIPTION,
    PEER_SHARPEN,
    REPO_ID,
    loaded_code_modules,
    marker_code,
    write_repo,
)

hub_commits, hub = block_repos.hub_commits, block_repos.hub  # the hub cache fixtures


def test_untrusted_code_is_refused_naming_the_file_and_does_not_run(tmp_path):
    """Without trust_remote_code=True the error names the file that would run, and the code never runs."""
    marker = tmp_path / "ran.txt"
    folder = write_repo(tmp_path / "repo", marker_code(marker))
    with pytest.raises(BlockRepoError) as info:
        ModularPipelineBlocks.from_pretrained(folder)
    assert str(info.value) == (
        f"Block folder '{folder}' holds custom code: loading it runs {folder / 'block.py'} (class "
        f"SharpenImagesStep). Read that file; if you trust it, pass trust_remote_code=True."
    )
    assert not marker.exists()
    ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    assert marker.read_text() == "ran"  # the marker does show when the code runs


def test_untrusted_hub_code_is_refused_naming_repo_and_commit(hub):
    """The refusal for a repo id names the repo, the revision and the commit it would run."""
    with pytest.raises(
        BlockRepoError, match=rf"Block repo 'org/sharpen' \(revision 'v2', commit {hub['v2']}\)"
    ):
        ModularPipelineBlocks.from_pretrained(REPO_ID, revision="v2")


def test_missing_config_is_a_clear_error(tmp_path):
    """A folder without modular_config.json names the folder and the files it has."""
    folder = write_repo(tmp_path / "repo")
    (folder / "modular_config.json").unlink()
    with pytest.raises(
        BlockRepoError, match=r"has no modular_config.json in .* \(files there: \['block.py'\]\)"
    ):
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[1, 2]", r"modular_config.json must hold a JSON object \(got list\)"),
        ("{not json", r"modular_config.json is not valid JSON"),
        ('{"auto_map": {"Other": "block.X"}}', r'must name the block\'s code as "auto_map"'),
        ('{"auto_map": {"ModularPipelineBlocks": "block"}}', r"auto_map entry 'block' must read"),
    ],
    ids=["not-an-object", "not-json", "no-entry", "no-class"],
)
def test_a_bad_config_is_a_clear_error(tmp_path, config, message):
    """A config that is not an object, not JSON, or lacks a usable auto_map entry is refused."""
    folder = write_repo(tmp_path / "repo")
    (folder / "modular_config.json").write_text(config)
    with pytest.raises(BlockRepoError, match=message):
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)


def test_config_naming_a_missing_file_or_class_runs_nothing(tmp_path):
    """A missing code file lists the Python files; a missing class lists the classes; no code runs."""
    marker = tmp_path / "ran.txt"
    folder = write_repo(tmp_path / "repo", marker_code(marker))
    (folder / "modular_config.json").write_text(
        json.dumps({"auto_map": {"ModularPipelineBlocks": "blocks.X"}})
    )
    with pytest.raises(
        BlockRepoError,
        match=r"names the code file 'blocks.py', which is not in the repo \(Python files there: \['block.py'\]\)",
    ):
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    (folder / "modular_config.json").write_text(
        json.dumps({"auto_map": {"ModularPipelineBlocks": "block.Sharpen"}})
    )
    with pytest.raises(
        BlockRepoError,
        match=r"names class 'Sharpen', which block.py does not define \(classes defined there: \['UnsharpMask', 'SharpenImagesStep'\]\)",
    ):
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    assert not marker.exists()


@pytest.mark.parametrize("reference", ["../x.Evil", "/tmp/x.Evil", "sub/../../x.Evil"])
def test_a_code_path_outside_the_repo_is_refused(tmp_path, reference):
    """auto_map naming a file outside the repo is refused before anything is read or run."""
    marker = tmp_path / "ran.txt"
    (tmp_path / "x.py").write_text(marker_code(marker).replace("SharpenImagesStep", "Evil"))
    folder = write_repo(tmp_path / "repo", config={"auto_map": {"ModularPipelineBlocks": reference}})
    with pytest.raises(BlockRepoError, match=r"which is outside the repo .* nothing was read or run"):
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    assert not marker.exists()


def test_a_class_that_is_not_a_block_is_refused_and_nothing_is_registered(tmp_path):
    """A class that is not a ModularPipelineBlocks subclass is named, and its modules are not kept."""
    code = """
    class NotABlock:
        pass
    """
    folder = write_repo(tmp_path / "repo", code, {"auto_map": {"ModularPipelineBlocks": "block.NotABlock"}})
    before = loaded_code_modules()
    with pytest.raises(
        BlockRepoError,
        match=r"block.py's NotABlock must be a subclass of ModularPipelineBlocks \(got class NotABlock with bases \('object',\)\)",
    ):
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    assert loaded_code_modules() == before


def test_code_that_fails_at_import_chains_the_error_and_registers_nothing(tmp_path):
    """An exception while importing is a BlockCodeError (an ImportError) with the original as its cause."""
    code = PEER_SHARPEN.format(amount=0.5, description=DESCRIPTION) + "\nraise RuntimeError('no GPU here')\n"
    folder = write_repo(tmp_path / "repo", code)
    before = loaded_code_modules()
    with pytest.raises(BlockCodeError, match=r"block.py failed to import: RuntimeError: no GPU here") as info:
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert loaded_code_modules() == before
    (folder / "block.py").write_text(PEER_SHARPEN.format(amount=0.5, description=DESCRIPTION))
    assert ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True).description == DESCRIPTION


def test_code_that_does_not_parse_is_refused_before_running(tmp_path):
    """A syntax error is a BlockCodeError naming the line; nothing ran."""
    folder = write_repo(tmp_path / "repo", "class SharpenImagesStep(:\n    pass\n")
    with pytest.raises(BlockCodeError, match=r"block.py is not valid Python \(.*line 1\); nothing ran"):
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)


PEER_ONLY_NAMES = """
from diffusers.modular_pipelines import InputParam, InsertableDict, ModularPipelineBlocks, OutputParam
from diffusers.modular_pipelines import WanModularPipeline
from diffusers import AutoModel, FluxModularPipeline


class UsesPeerNames(ModularPipelineBlocks):
    inputs = [InputParam("x")]
    intermediate_outputs = [OutputParam("y")]

    def __call__(self, components: WanModularPipeline, state):
        block_state = self.get_block_state(state)
        block_state.y = block_state.x + 1
        self.set_block_state(state, block_state)
        return components, state

    def ordered(self) -> "InsertableDict | None":
        return InsertableDict()

    hint = WanModularPipeline | None

    def flux_pipeline(self):
        return FluxModularPipeline()

    def auto_model(self):
        return AutoModel

    def is_wan(self, components):
        return isinstance(components, WanModularPipeline)
"""


def test_a_peer_name_without_a_counterpart_imports_and_refuses_its_use(tmp_path):
    """Block code may import the peer's names that this project does not map (its family pipelines, as type
    hints), from diffusers.modular_pipelines or top-level diffusers: the block loads and runs; calling one is
    a PeerImportError naming it and the mapped names."""
    config = {"auto_map": {"ModularPipelineBlocks": "block.UsesPeerNames"}}
    block = ModularPipelineBlocks.from_pretrained(
        write_repo(tmp_path / "repo", PEER_ONLY_NAMES, config), trust_remote_code=True
    )
    assert block.init_pipeline()(x=1, output="y") == 2
    with pytest.raises(
        PeerImportError,
        match=r"block.py: 'InsertableDict' is the peer's \(diffusers.modular_pipelines\), which this project does "
        r"not map, so it can be imported but not called.*'ModularPipelineBlocks'",
    ):
        block.ordered()
    with pytest.raises(PeerImportError, match=r"'FluxModularPipeline' is the peer's \(diffusers\)"):
        block.flux_pipeline()  # the same from top-level diffusers
    with pytest.raises(PeerImportError, match=r"'WanModularPipeline' .* but not used in isinstance"):
        block.is_wan(None)  # rather than a bare TypeError, or a silent False
    import diffusers

    assert block.auto_model() is diffusers.AutoModel  # the rest of diffusers is the real thing


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (
            "from diffusers.modular_pipelines import WanModularPipeline\n\n\nclass Mine(WanModularPipeline):\n    pass\n",
            r"'WanModularPipeline' is the peer's .* but not subclassed",
        ),
        (
            "from diffusers.modular_pipelines import ModularPipelineBlocks, WanModularPipelin\n\n\n"
            "class Mine(ModularPipelineBlocks):\n    pass\n",
            r"imports 'WanModularPipelin' from diffusers.modular_pipelines, which the peer does not have either",
        ),
    ],
    ids=["subclassed", "misspelt"],
)
def test_a_peer_name_without_a_counterpart_is_refused_when_subclassed_or_misspelt(tmp_path, code, message):
    """Subclassing an unmapped peer name fails while the code imports, as does a name the peer lacks too."""
    folder = write_repo(tmp_path / "repo", code, {"auto_map": {"ModularPipelineBlocks": "block.Mine"}})
    with pytest.raises(BlockCodeError, match=message) as info:
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    assert isinstance(info.value.__cause__, PeerImportError)


def test_a_relative_import_above_the_repo_is_refused(tmp_path):
    """`from ..outside import x` in a repo's top-level file cannot reach the folder above the repo."""
    marker = tmp_path / "ran.txt"
    (tmp_path / "outside.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
    )
    code = "from ..outside import x\n" + PEER_SHARPEN.format(amount=0.5, description=DESCRIPTION)
    folder = write_repo(tmp_path / "repo", code)
    with pytest.raises(
        BlockCodeError, match=r"'from \.\.outside import x' reaches above the block repo's folder"
    ):
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    assert not marker.exists()


def test_a_revision_that_does_not_exist_is_a_clear_error(hub):
    """An unknown revision names the repo and lists the cached refs."""
    with pytest.raises(
        RevisionNotFoundError,
        match=r"Revision 'nope' of block repo 'org/sharpen' .* Cached refs: \['main', 'v2'\]",
    ):
        ModularPipelineBlocks.from_pretrained(REPO_ID, revision="nope", trust_remote_code=True)


def test_a_revision_for_a_local_folder_is_refused(tmp_path):
    """A folder has no revisions: asking for one is an error rather than silently unpinned code."""
    folder = write_repo(tmp_path / "repo")
    with pytest.raises(
        BlockRepoError,
        match=r"is a local folder, which has no revisions, so revision='v2' cannot be honoured",
    ):
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True, revision="v2")


def test_neither_a_folder_nor_a_repo_id_is_a_clear_error(tmp_path):
    """A path that does not exist and is no repo id names both readings."""
    with pytest.raises(RepoNotFoundError, match=r"no such local folder .* and not a hub repo id"):
        ModularPipelineBlocks.from_pretrained(str(tmp_path / "no" / "such" / "dir"), trust_remote_code=True)


def test_unmet_requirements_are_refused_before_the_code_runs(tmp_path):
    """The peer's `requirements` field is checked: a missing package or version is named."""
    marker = tmp_path / "ran.txt"
    config = {**CONFIG, "requirements": {"torch": ">=999", "no-such-package-xyz": None}}
    folder = write_repo(tmp_path / "repo", marker_code(marker), config)
    with pytest.raises(
        BlockRepoError, match=r"torch>=999 is wanted, .* is installed; no-such-package-xyz is not installed"
    ):
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    assert not marker.exists()


def test_a_subfolder_outside_the_repo_is_refused(tmp_path):
    """subfolder='../x' is refused before anything is read."""
    write_repo(tmp_path / "x")
    (tmp_path / "repo").mkdir()
    with pytest.raises(SubfolderOutsideRepoError, match=r"subfolder '../x' must be a folder inside the repo"):
        ModularPipelineBlocks.from_pretrained(tmp_path / "repo", trust_remote_code=True, subfolder="../x")


def test_trust_remote_code_must_be_a_bool(tmp_path):
    """A truthy non-bool (a string) is not consent: TypeError, and the code does not run."""
    marker = tmp_path / "ran.txt"
    folder = write_repo(tmp_path / "repo", marker_code(marker))
    with pytest.raises(
        TypeError, match=r"trust_remote_code must be True or False \(got 'no' that is a str\)"
    ):
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code="no")
    assert not marker.exists()
