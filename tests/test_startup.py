"""Start-up pays for what it uses: the command line's help, listings and refusals import neither torch nor
diffusers, finding the families imports none of their modules, and the packages import their public
names on first use. Each check runs a cold interpreter, as a user's command does."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from modular import BlockFamily, SequentialPipelineBlocks, available_families
from offload.lazy_exports import typed_imports

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "diffusers", "transformers")
LAZY_PACKAGES = (
    "offload",
    "components",
    "modular",
    "blocks.stable_diffusion",
    "blocks.stable_diffusion_xl",
    "blocks.flux",
    "blocks.z_image",
    "blocks.flux2",
    "blocks.sd3",
    "blocks.qwenimage",
    "blocks.wan",
)


def cold(code: str) -> Any:
    """Run ``code`` in a fresh interpreter; it prints one JSON object last, which is returned."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def command_line(argv: list[str]) -> dict:
    """``modular *argv`` in a fresh interpreter: its exit status, its output and the heavy modules it imported."""
    code = f"""
import contextlib, io, json, sys
from modular.cli.main import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        status = main({argv!r})
    except SystemExit as stop:
        status = stop.code
heavy = sorted(name for name in sys.modules if name.split(".")[0] in {HEAVY!r})
print(json.dumps({{"status": status, "out": out.getvalue(), "err": err.getvalue(), "heavy": heavy}}))
"""
    return cold(code)


@pytest.mark.parametrize(
    "argv",
    [["--help"], [], ["--version"], ["serve", "--help"]],
    ids=["help", "bare", "version", "serve-help"],
)
def test_help_imports_neither_torch_nor_diffusers(argv):
    """`modular --help`, bare `modular` (the same usage), `modular --version` and `modular serve --help`
    answer without torch."""
    done = command_line(argv)
    assert done["status"] == 0 and done["out"].startswith(
        "usage: modular" if argv != ["--version"] else "modular "
    )
    assert done["heavy"] == []
    if argv == ["--help"]:
        assert "modular serve REPO_OR_WORKFLOW..." in done["out"]


def test_families_lists_them_without_importing_torch_or_their_modules():
    """`modular families` prints what each family declares; no family module, torch or diffusers is imported."""
    code = """
import contextlib, io, json, sys
from modular.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = main(["families"])
print(json.dumps({"status": status, "out": out.getvalue(),
    "loaded": sorted(n for n in sys.modules if n.split(".")[0] in ("torch", "diffusers", "transformers")
        or (n.startswith("blocks.") and n.count(".") > 1))}))
"""
    done = cold(code)
    assert done["status"] == 0
    assert (
        "flux: FluxAutoBlocks (ships a tiny repo and a scenario)\n  workflows: text2image, image2image, control\n"
        in (done["out"])
    )
    assert done["loaded"] == []


@pytest.mark.parametrize(
    "argv",
    [
        ["nope"],  # an unknown subcommand
        ["run", "--steps", "0"],
        ["run", "--seed", "-1"],
        ["run", "--budget", "lots"],
        ["run", "--dtype", "float64"],
        ["run", "--no-such-option"],
        ["run", "repo", "--then", "--steps", "2"],  # --then without its REPO
        ["batch"],  # no JOB
        ["batch", "job.json", "--offload", "gpu"],
        ["inspect", "--workflow"],
        ["serve"],  # no REPO_OR_WORKFLOW
        ["serve", "repo", "--port", "http"],
        ["serve", "repo", "--host", "0.0.0.0"],  # another address without a token: refused before torch
        ["serve", "repo", "--offload", "sim"],  # sim without --budget
        ["serve", "repo", "--replicas", "2"],  # an option of --ray without it
        ["serve", "repo", "--ray", "--state", "jobs"],  # one machine's option with --ray
        ["serve", "repo", "--ray", "--autoscale", "4:1"],
    ],
)
def test_every_argument_error_imports_neither_torch_nor_diffusers(argv):
    """A refused argument is argparse's one line and status 2, before anything heavy is imported."""
    done = command_line(argv)
    assert done["status"] == 2
    assert done["err"].count("\n") == 1 and ": error: " in done["err"]
    assert done["heavy"] == []


def test_finding_the_families_imports_none_of_their_modules():
    """The entry points load each family's declaration only; the one asked for imports its modules."""
    code = """
import json, sys
from modular import available_families
found = available_families()
before = sorted(n for n in sys.modules if n.startswith("blocks.") and n.count(".") > 1 or n == "torch")
found["flux"].blocks_class
after = sorted(n for n in sys.modules if n.startswith("blocks.") and n.count(".") > 1)
print(json.dumps({"names": sorted(found), "before": before, "after": after}))
"""
    done = cold(code)
    assert {"flux", "stable-diffusion", "stable-diffusion-xl", "z-image"} <= set(done["names"])
    assert done["before"] == []
    assert "blocks.flux.modular_blocks" in done["after"]
    assert not any(
        name.startswith(("blocks.stable_diffusion.", "blocks.z_image.", "blocks.flux2."))
        for name in done["after"]
    )


def test_the_declared_workflows_are_the_blocks_own():
    """What a family declares for `modular families` is what its blocks class names."""
    for family in available_families().values():
        blocks = family.blocks_class()
        assert family.workflows == list(blocks.available_workflows), family.name
        assert family.blocks_class_names == tuple(c.__name__ for c in family.all_blocks_classes)


def test_a_family_named_by_paths_resolves_them_when_used():
    family = BlockFamily(
        name="x",
        blocks_class="modular.framework.sequential.SequentialPipelineBlocks",
        make_tiny_repo="json.dumps",
    )
    assert family.blocks_class_names == ("SequentialPipelineBlocks",)
    assert family.blocks_class is SequentialPipelineBlocks
    assert family.make_tiny_repo is json.dumps and family.ships_tiny_repo and not family.ships_demo


def test_a_path_that_names_nothing_is_a_clear_error():
    family = BlockFamily(name="x", blocks_class="modular.framework.sequential.NoSuchBlocks")
    with pytest.raises(
        TypeError, match="family 'x': blocks_class 'modular.framework.sequential.NoSuchBlocks' names no class"
    ):
        family.blocks_class  # noqa: B018


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_a_lazy_package_types_what_it_exports(package):
    """Every public name is imported under ``if TYPE_CHECKING:`` (where type checkers see it, and what the lazy
    ``__getattr__`` reads) or defined by the package itself, imports, and is listed by dir()."""
    module = importlib.import_module(package)
    typed = typed_imports(Path(module.__file__).read_text())
    untyped = [name for name in module.__all__ if name not in typed and name not in vars(module)]
    assert typed and untyped == []
    assert set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_only_imports_go_under_type_checking():
    """The lazy table is the `if TYPE_CHECKING:` block, so anything else there is refused when read."""
    with pytest.raises(SyntaxError, match="only `from ... import ...` lines go under `if TYPE_CHECKING:`"):
        typed_imports("if TYPE_CHECKING:\n    import torch\n")


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_importing_a_package_imports_none_of_its_modules(package):
    """Importing the package alone imports neither torch nor diffusers; its names import when first used."""
    done = cold(
        f"import json, sys, {package}\n"
        f"print(json.dumps(sorted(n for n in sys.modules if n.split('.')[0] in {HEAVY!r})))"
    )
    assert done == []


def test_an_unknown_name_is_an_attribute_error():
    import modular

    with pytest.raises(AttributeError, match="module 'modular' has no attribute 'NoSuchThing'"):
        modular.NoSuchThing  # noqa: B018


FAMILIES = ("stable_diffusion", "stable_diffusion_xl", "flux", "z_image", "flux2", "sd3", "qwenimage", "wan")
# What a family's blocks import only when a pipeline is composed, loaded or run: diffusers' and transformers'
# models, diffusers' guiders and hooks, peft (seconds of imports, e.g. about 2 s for FluxTransformer2DModel).
MODEL_MODULES = (
    "diffusers.models.transformers",
    "diffusers.models.unets",
    "diffusers.models.autoencoders",
    "diffusers.models.embeddings",
    "diffusers.guiders",
    "diffusers.hooks",
    "peft",
    "transformers.modeling_utils",
    "transformers.models.clip",
    "transformers.models.t5",
)


@pytest.fixture(scope="module")
def model_modules_after_each_family() -> dict[str, list[str]]:
    """One cold interpreter imports every module of each family in turn (its blocks, checks, tiny-repo builder,
    and its blocks class); per family, the model modules loaded once its modules are imported. One interpreter
    for all families, not one each (seconds of torch and diffusers imports apiece): the lists are cumulative, so
    a family's list is empty only if neither it nor a family before it imported a model module."""
    return cold(
        "import importlib, json, pkgutil, sys\n"
        "after = {}\n"
        f"for family in {FAMILIES!r}:\n"
        "    package = importlib.import_module(f'blocks.{family}')\n"
        "    for found in pkgutil.iter_modules(package.__path__):\n"
        "        importlib.import_module(f'{package.__name__}.{found.name}')\n"
        "    package.FAMILY.blocks_class\n"
        f"    after[family] = sorted(n for n in sys.modules if n.startswith({MODEL_MODULES!r}))\n"
        "print(json.dumps(after))"
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_importing_every_module_of_a_family_imports_no_model(family, model_modules_after_each_family):
    """Every module of the family (its blocks, checks, tiny-repo builder) imports, and no model module does."""
    assert model_modules_after_each_family[family] == []


def test_a_spec_that_names_its_class_by_path_imports_it_when_read(tmp_path):
    """``type_hint`` by dotted path: the class is imported on first read, and the spec loads as with the class."""
    from diffusers import AutoencoderKL

    from blocks.stable_diffusion import make_tiny_repo
    from components import ComponentSpec

    repo = make_tiny_repo(tmp_path / "tiny")
    by_path = ComponentSpec("vae", "diffusers.AutoencoderKL", repo=repo, subfolder="vae")
    assert by_path == ComponentSpec("vae", AutoencoderKL, repo=repo, subfolder="vae")
    assert by_path.type_hint is AutoencoderKL
    assert type(by_path.load()) is AutoencoderKL


def test_a_spec_path_that_names_no_class_is_a_clear_error():
    from components import ComponentLoadError, ComponentSpec

    with pytest.raises(TypeError, match="or the class's dotted path such as 'diffusers.AutoencoderKL'"):
        ComponentSpec("vae", "AutoencoderKL")
    spec = ComponentSpec("vae", "diffusers.NoSuchModel")
    with pytest.raises(
        ComponentLoadError, match="ComponentSpec 'vae': type_hint 'diffusers.NoSuchModel' names no class"
    ):
        spec.type_hint  # noqa: B018
