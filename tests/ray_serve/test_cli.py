"""``modular serve --ray``: one line and status 2, with Ray Serve or without it (runs everywhere)."""

from __future__ import annotations

import sys

import pytest

from modular.cli.main import main
from modular.cli.serve_command import RAY_EXTRA


def test_without_ray_it_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(
        sys.modules, "ray", None
    )  # `import ray` now raises ImportError, as where it is missing
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    assert main(["serve", "--ray", "./tiny-sd"]) == 2
    assert capsys.readouterr().err == (
        'modular serve: error: --ray needs Ray Serve: pip install "modular-pipelines[ray]"\n'
    )
    assert RAY_EXTRA == 'pip install "modular-pipelines[ray]"'
    assert list(tmp_path.iterdir()) == []  # nothing started, no state folder


def test_with_ray_it_says_the_command_is_not_built_yet(tmp_path, capsys, monkeypatch):
    pytest.importorskip("ray.serve", reason='needs Ray Serve: pip install "modular-pipelines[ray]"')
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--ray", "./tiny-sd"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("modular serve: error: --ray is not built yet") and err.count("\n") == 1
    assert "build_app" in err and list(tmp_path.iterdir()) == []
