"""modular.logging: one switch for the project's loggers, the libraries it drives, and every progress bar."""

import logging

import diffusers.utils.logging
import huggingface_hub.utils
import pytest
import transformers.utils.logging

from components import ComponentSpec
from modular import logging as modular_logging

from .toy_blocks import SumLoop


@pytest.fixture(autouse=True)
def restored():
    """Each test leaves the switches as it found them."""
    levels = {root: logging.getLogger(root).level for root in modular_logging.ROOTS}
    library_levels = (diffusers.utils.logging.get_verbosity(), transformers.utils.logging.get_verbosity())
    yield
    for root, level in levels.items():
        logging.getLogger(root).setLevel(level)
    diffusers.utils.logging.set_verbosity(library_levels[0])
    transformers.utils.logging.set_verbosity(library_levels[1])
    modular_logging.enable_progress_bar(loading=False)


def test_set_verbosity_error_reaches_every_root_and_the_libraries(caplog):
    """After set_verbosity_error, a warning of any of our four roots, of diffusers or of transformers is not
    emitted; set_verbosity_info lets info through again."""
    modular_logging.set_verbosity_error()
    assert modular_logging.get_verbosity() == logging.ERROR
    for name in (*modular_logging.ROOTS, "offload.engine.engine", "blocks.flux.denoise"):
        assert not logging.getLogger(name).isEnabledFor(logging.WARNING), name
    assert diffusers.utils.logging.get_verbosity() == logging.ERROR
    assert transformers.utils.logging.get_verbosity() == logging.ERROR
    modular_logging.set_verbosity_info()
    assert logging.getLogger("components.manager").isEnabledFor(logging.INFO)
    assert diffusers.utils.logging.get_verbosity() == logging.INFO


def test_disable_progress_bar_hides_the_loops_bars_and_the_libraries(capsys):
    """A loop's bar is hidden by the switch unless its pipeline's config says otherwise; the libraries' loading
    and download bars follow the switch too."""
    pipe = SumLoop().init_pipeline()
    modular_logging.disable_progress_bar()
    assert pipe(n=3, output="total") == 3
    assert capsys.readouterr().err == ""
    assert not diffusers.utils.logging.is_progress_bar_enabled()
    assert not transformers.utils.logging.is_progress_bar_enabled()
    assert huggingface_hub.utils.are_progress_bars_disabled()
    pipe.set_progress_bar_config(disable=False)  # the pipeline's own word wins
    pipe(n=3)
    assert "3/3" in capsys.readouterr().err
    modular_logging.enable_progress_bar()
    assert diffusers.utils.logging.is_progress_bar_enabled() and modular_logging.is_progress_bar_enabled()


def test_a_load_shows_no_loading_bar_by_default_and_does_when_enabled(repo, capsys):
    """ComponentSpec.load draws no transformers "Loading weights" bar unless enable_progress_bar() asked for
    the libraries' loading bars; transformers' own switch is left as it was."""
    modular_logging.enable_progress_bar(
        loading=False
    )  # the defaults (an in-process `modular run` turns bars off)
    spec = ComponentSpec("text_encoder", repo=str(repo), subfolder="text_encoder")
    capsys.readouterr()
    spec.load()
    assert "Loading weights" not in capsys.readouterr().err
    assert transformers.utils.logging.is_progress_bar_enabled()
    modular_logging.enable_progress_bar()
    spec.load()
    assert "Loading weights" in capsys.readouterr().err
    modular_logging.enable_progress_bar(loading=False)
    spec.load()
    assert "Loading weights" not in capsys.readouterr().err


def test_a_sharded_diffusers_load_shows_no_shard_bar_by_default(repo, tmp_path, capsys):
    """diffusers' "Loading checkpoint shards" bar is hidden in our loads by default and shown when enabled;
    diffusers' switch is back on after the load."""
    vae = ComponentSpec("vae", repo=str(repo), subfolder="vae").load()
    vae.save_pretrained(tmp_path / "vae", max_shard_size="20KB")
    assert len(list((tmp_path / "vae").glob("*.safetensors"))) > 1
    spec = ComponentSpec("vae", repo=str(tmp_path), subfolder="vae")
    modular_logging.enable_progress_bar(loading=False)  # the defaults
    capsys.readouterr()
    spec.load()
    assert "Loading checkpoint shards" not in capsys.readouterr().err
    assert diffusers.utils.logging.is_progress_bar_enabled()
    modular_logging.enable_progress_bar()
    spec.load()
    assert "Loading checkpoint shards" in capsys.readouterr().err


def test_a_load_keeps_the_users_tqdm_hook(repo):
    """A tqdm hook the user gave transformers still sees every bar made during our load, and is the hook
    again after it."""
    seen = []

    def user_hook(factory, args, kwargs):
        seen.append(kwargs.get("desc"))
        return factory(*args, **kwargs)

    previous = transformers.utils.logging.set_tqdm_hook(user_hook)
    try:
        ComponentSpec("text_encoder", repo=str(repo), subfolder="text_encoder").load()
        assert "Loading weights" in seen
    finally:
        assert transformers.utils.logging.set_tqdm_hook(previous) is user_hook
