"""modular.logging: one switch for the project's loggers, the libraries it drives, and every progress bar."""

import logging

import diffusers.utils.logging
import huggingface_hub.utils
import pytest
import transformers.utils.logging

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
    modular_logging.enable_progress_bar()


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
