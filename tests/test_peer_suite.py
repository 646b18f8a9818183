"""scripts/peer_suite.py: the import rewrite, the repo substitution, the helper extraction and the counts,
on small synthetic files and a synthetic "peer" test tree (no diffusers mirror, no network, no torch)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "peer_suite.py"


@pytest.fixture(scope="module")
def suite():
    spec = importlib.util.spec_from_file_location("peer_suite", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peer_suite"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["peer_suite"]


PEER_TEST = textwrap.dedent(
    """\
    import diffusers
    from diffusers import ClassifierFreeGuidance, FooAutoBlocks, FooModularPipeline
    from diffusers.modular_pipelines import (
        ComponentsManager,
        KontextAutoBlocks,
        ModularPipeline as PeerPipeline,
    )

    from ..testing_utils import torch_device

    if diffusers:
        from diffusers.modular_pipelines.components_manager import AutoOffloadStrategy


    class FooConfig:
        pipeline_blocks_class = FooAutoBlocks
        pretrained_model_name_or_path = "hf-internal-testing/tiny-foo"

        def other(self):
            pretrained_model_name_or_path = "kept: not a class attribute"
            return pretrained_model_name_or_path


    class FooImg2ImgConfig(FooConfig):
        pretrained_model_name_or_path = (
            "hf-internal-testing/tiny-foo-img2img"
        )
    """
)
NAMES = {"FooAutoBlocks": "blocks.foo.FooAutoBlocks", "FooModularPipeline": "modular.ModularPipeline"}


def _imports(source: str) -> list[str]:
    return [ast.unparse(n) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)]


def test_framework_names_are_the_peer_names_block_code_gets(suite):
    """The script keeps its own list (importing modular costs seconds); it is modular's list."""
    source = (SCRIPT.parents[1] / "modular" / "remote" / "peer_imports.py").read_text()
    [names] = [
        node.value
        for node in ast.parse(source).body
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and "PEER_NAMES"
        in {t.id for t in ([node.target] if isinstance(node, ast.AnnAssign) else node.targets)}
    ]
    assert tuple(suite.FRAMEWORK_NAMES) == ast.literal_eval(names)


def test_import_rewrite_maps_the_table_and_the_framework_and_leaves_the_rest(suite):
    done = suite.rewrite_imports(PEER_TEST, NAMES)
    assert _imports(done.source) == [
        "from diffusers import ClassifierFreeGuidance",
        "from blocks.foo import FooAutoBlocks as FooAutoBlocks",
        "from modular import ModularPipeline as FooModularPipeline",
        "from diffusers.modular_pipelines import KontextAutoBlocks",
        "from modular import ComponentsManager as ComponentsManager",
        "from modular import ModularPipeline as PeerPipeline",
        "from ..testing_utils import torch_device",
        "from diffusers.modular_pipelines.components_manager import AutoOffloadStrategy",
    ]
    assert sorted(done.mapped) == [
        "ComponentsManager",
        "FooAutoBlocks",
        "FooModularPipeline",
        "ModularPipeline",
    ]
    # Modular-looking names left to the peer are reported; a guider from top-level diffusers is not one.
    assert sorted(done.unmapped) == ["AutoOffloadStrategy", "KontextAutoBlocks"]
    # The nested import keeps its indentation, the rest of the file is as it was.
    assert (
        "    from diffusers.modular_pipelines.components_manager import AutoOffloadStrategy\n" in done.source
    )
    assert done.source.split("from ..testing_utils")[1] == PEER_TEST.split("from ..testing_utils")[1]


def test_a_file_without_peer_imports_is_unchanged(suite):
    source = "from ..testing_utils import torch_device\nimport torch\n"
    assert suite.rewrite_imports(source, NAMES).source == source


def test_repo_substitution_sets_each_config_class_attribute(suite):
    ours = {"hf-internal-testing/tiny-foo": "/tmp/repos/foo-modular"}
    source, done = suite.substitute_repos(PEER_TEST, lambda repo_id: ours.get(repo_id, "/tmp/repos/other"))
    assert done == [
        ("hf-internal-testing/tiny-foo", "/tmp/repos/foo-modular"),
        ("hf-internal-testing/tiny-foo-img2img", "/tmp/repos/other"),
    ]
    tree = ast.parse(source)
    values = [
        (cls.name, statement.value.value)
        for cls in tree.body
        if isinstance(cls, ast.ClassDef)
        for statement in cls.body
        if isinstance(statement, ast.Assign) and statement.targets[0].id == "pretrained_model_name_or_path"
    ]
    assert values == [("FooConfig", "/tmp/repos/foo-modular"), ("FooImg2ImgConfig", "/tmp/repos/other")]
    assert '"kept: not a class attribute"' in source  # a local variable of a method is not a config


def test_helpers_from_other_peer_test_modules_are_extracted_alone(suite):
    family_test = (
        "from ...models.unets.test_unet import make_state\nfrom ...testing_utils import floats_tensor\n"
    )
    found = suite.helper_imports(family_test, "tests/modular_pipelines/foo/test_foo.py")
    assert found == {"tests/models/unets/test_unet.py": {"make_state"}}
    helper_module = textwrap.dedent(
        """\
        import os
        from ..test_modeling_common import HeavyMixin

        SCALE = 2


        def _inner(x):
            return x * SCALE


        def make_state(x):
            return _inner(x) + 1


        class HeavyTests(HeavyMixin):
            pass
        """
    )
    extracted = suite.extract_definitions(helper_module, ["make_state"])
    namespace: dict = {}
    exec(compile(extracted, "helper", "exec"), namespace)
    assert namespace["make_state"](3) == 7
    assert "HeavyTests" not in namespace and "test_modeling_common" not in extracted


FAKE_PEER = {
    "tests/__init__.py": "",
    "tests/conftest.py": "",
    "tests/testing_utils.py": "torch_device = 'cpu'\n",
    "tests/modular_pipelines/__init__.py": "",
    "tests/modular_pipelines/testing_utils/__init__.py": "from .common import ConfigBase\n",
    "tests/modular_pipelines/testing_utils/common.py": textwrap.dedent(
        """\
        from ...testing_utils import torch_device


        class ConfigBase:
            def repo(self):
                return self.pretrained_model_name_or_path
        """
    ),
    "tests/modular_pipelines/foo/__init__.py": "",
    "tests/modular_pipelines/foo/test_modular_pipeline_foo.py": textwrap.dedent(
        """\
        import pytest
        from diffusers.modular_pipelines import FooAutoBlocks

        from ...models.helpers import answer
        from ..testing_utils import ConfigBase


        class TestFoo(ConfigBase):
            pipeline_blocks_class = FooAutoBlocks
            pretrained_model_name_or_path = "hf-internal-testing/tiny-foo"

            def test_repo_is_ours(self):
                assert self.repo() == "REPO"

            def test_blocks_are_ours(self):
                assert self.pipeline_blocks_class.__module__ == "collections"

            def test_fails(self):
                assert answer() == 41, "the answer is 42"

            def test_skips(self):
                pytest.skip("not here")

            def test_errors(self, missing_fixture):
                pass


        class PeerOnly:
            pass


        PeerOnly.__module__ = "diffusers.modular_pipelines.bar"


        class TestPeerOnly(ConfigBase):
            pipeline_blocks_class = PeerOnly

            def test_anything(self):
                pass
        """
    ),
    "tests/modular_pipelines/bar/__init__.py": "",
    "tests/modular_pipelines/bar/test_modular_pipeline_bar.py": "def test_bar():\n    pass\n",
    "tests/models/helpers.py": "from .heavy import Nothing\n\n\ndef answer():\n    return 42\n",
}


def _write(folder: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)


def test_a_synthetic_peer_tree_runs_and_is_counted_per_family(suite, tmp_path):
    """From a git directory: the tree is written, rewritten, run by pytest and counted per family."""
    checkout = tmp_path / "diffusers"
    _write(checkout, FAKE_PEER)
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "peer"], check=True)
    peer = suite.PeerSource(checkout / ".git")
    assert peer.git

    families = [
        suite.PeerFamily("foo", "collections", "foo", {"FooAutoBlocks": "collections.OrderedDict"}),
        suite.PeerFamily("bar", "json", "bar", {"BarAutoBlocks": "json.JSONDecoder"}),
    ]
    tree = tmp_path / "tree"
    notes = suite.build_tree(peer, tree, families, lambda family, repo_id: "REPO")
    assert "foo: hf-internal-testing/tiny-foo -> REPO" in notes
    assert "helper tests/models/helpers.py: answer extracted" in notes
    assert (tree / "tests/models/__init__.py").exists()  # the extracted helper's package

    junit = tmp_path / "report.xml"
    targets = ["tests/modular_pipelines/foo", "tests/modular_pipelines/bar"]
    # Without the venv's plugins (hypothesis, anyio, ...) the run starts in a fraction of the time.
    code = suite.run_pytest(tree, targets, ["-q"], junit, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert code == 1  # a failure: the report, not a crash
    counts = suite.parse_junit(junit, {"foo": "foo", "bar": "bar"})
    foo, bar = counts["foo"], counts["bar"]
    assert (foo.passed, foo.failed, foo.skipped, foo.errors) == (2, 1, 2, 1)
    assert (bar.passed, bar.failed, bar.skipped, bar.errors) == (1, 0, 0, 0)
    assert sorted(foo.reasons) == ["TestFoo::test_errors", "TestFoo::test_fails"]
    assert foo.reasons["TestFoo::test_fails"] == "AssertionError: the answer is 42"
    assert foo.reasons["TestFoo::test_errors"].startswith("failed on setup with")  # the missing fixture
    assert foo.skip_reasons == {"not here": 1, "no counterpart here: the peer's PeerOnly": 1}
    printed = suite.report(counts)
    assert printed.splitlines()[0] == "foo: 2 passed, 1 failed, 2 skipped, 1 errors"
    assert "  FAIL TestFoo::test_fails: AssertionError: the answer is 42" in printed


def test_a_family_whose_tiny_repo_fails_is_left_out_saying_why(suite, tmp_path):
    _write(tmp_path / "diffusers", FAKE_PEER)
    peer = suite.PeerSource(tmp_path / "diffusers")

    def repo_for(family, repo_id):
        raise ValueError("no installed family serves 'FooPipeline'\nmore")

    families = [suite.PeerFamily("foo", "collections", "foo", {"FooAutoBlocks": "collections.OrderedDict"})]
    notes = suite.build_tree(peer, tmp_path / "tree", families, repo_for)
    assert notes == [
        "foo: skipped, its tiny repo could not be made: ValueError: no installed family serves 'FooPipeline'"
    ]
    assert not (tmp_path / "tree/tests/modular_pipelines/foo").exists()
    assert (tmp_path / "tree/tests/modular_pipelines/testing_utils/common.py").exists()


def test_a_checkout_is_read_from_disk(suite, tmp_path):
    _write(tmp_path, {"tests/modular_pipelines/testing_utils/__init__.py": "", "tests/x.py": "x = 1\n"})
    peer = suite.PeerSource(tmp_path)
    assert not peer.git
    assert peer.read("tests/x.py") == "x = 1\n" and peer.read("tests/none.py") is None
    assert peer.listdir("tests") == ["tests/x.py"]


def test_families_left_out_say_why(suite, monkeypatch):
    rows = (
        suite.PeerFamily("ready", "json", "ready", {"ReadyAutoBlocks": "json.JSONDecoder"}),
        suite.PeerFamily("absent", "blocks.no_such_family", "absent", {"X": "blocks.no_such_family.X"}),
        suite.PeerFamily("unmapped", "json", "unmapped"),
    )
    monkeypatch.setattr(suite, "FAMILIES", rows)
    chosen, notes = suite.choose_families(None)
    assert [family.name for family in chosen] == ["ready"]
    assert notes == [
        "absent: skipped, blocks.no_such_family is not importable",
        "unmapped: skipped, no peer names mapped to ours yet (FAMILIES)",
    ]
    _, notes = suite.choose_families(["nope"])
    assert notes == ["nope: skipped, no row in scripts/peer_families.py FAMILIES"]


def test_keep_never_empties_a_folder_the_script_did_not_write(suite, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        suite, "FAMILIES", (suite.PeerFamily("ready", "json", "ready", {"R": "json.JSONDecoder"}),)
    )
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit) as exit_info:
        suite.main(["--diffusers", str(tmp_path / "nowhere"), "--keep", str(mine)])
    assert exit_info.value.code == 2
    assert "not empty and not a tree of this script's" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "keep me"
