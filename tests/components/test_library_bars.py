"""The libraries' loading bars in our loads only: other threads keep theirs, the switches are restored."""

import threading

import diffusers.utils.logging
import pytest
import transformers.utils.logging

from components.library_bars import library_bars_hidden, show_library_bars


@pytest.fixture(autouse=True)
def libraries_bars_on():
    """The libraries' own switches on for the test (an in-process `modular run` turns them off), then restored."""
    before = (
        diffusers.utils.logging.is_progress_bar_enabled(),
        transformers.utils.logging.is_progress_bar_enabled(),
    )
    diffusers.utils.logging.enable_progress_bar()
    transformers.utils.logging.enable_progress_bar()
    yield
    for module, was_on in zip((diffusers.utils.logging, transformers.utils.logging), before):
        if not was_on:
            module.disable_progress_bar()


def _bar(desc):
    list(transformers.utils.logging.tqdm(range(2), desc=desc))


def test_only_the_thread_inside_our_load_loses_its_bars(capsys):
    """Inside library_bars_hidden, this thread's transformers bars are hidden; a bar another thread makes
    meanwhile is drawn, and after the block this thread's are drawn again."""
    with library_bars_hidden():
        _bar("mine")
        other = threading.Thread(target=_bar, args=("theirs",))
        other.start()
        other.join()
    _bar("after")
    err = capsys.readouterr().err
    assert "theirs" in err and "after" in err and "mine" not in err


def test_a_failed_load_restores_diffusers_switch_and_transformers_hook():
    """An error inside leaves diffusers' progress switch on and transformers' tqdm hook as they were."""
    with pytest.raises(RuntimeError, match="boom"), library_bars_hidden():
        assert not diffusers.utils.logging.is_progress_bar_enabled()
        raise RuntimeError("boom")
    assert diffusers.utils.logging.is_progress_bar_enabled()
    assert transformers.utils.logging.set_tqdm_hook(None) is None


def test_shown_library_bars_pass_through(capsys):
    """After show_library_bars(True), a bar inside the block is drawn."""
    show_library_bars(True)
    try:
        with library_bars_hidden():
            _bar("shown")
    finally:
        show_library_bars(False)
    assert "shown" in capsys.readouterr().err
