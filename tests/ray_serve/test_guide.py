"""docs/serving.md's Ray Serve examples (its ```python-ray blocks) run as shown, in order, in one namespace,
and print what they show. Skipped where Ray Serve is not installed; tests/test_docs.py runs the guide's
```python blocks everywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray.serve", reason='needs Ray Serve: pip install "modular-pipelines[ray]"')

from tests.doc_outputs import fences, run_guide_text

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
pytestmark = pytest.mark.slow


def test_the_ray_examples_of_the_serving_guide_run_and_print_what_they_show(tmp_path, monkeypatch):
    blocks = [fence.text for fence in fences(GUIDE.read_text()) if fence.language == "python-ray"]
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    text = "".join(f"```python\n{block}```\n\n" for block in blocks)
    try:
        run_guide_text(text, "serving.md (python-ray)")
    finally:
        import ray
        from ray import serve

        if ray.is_initialized():  # a failed example leaves no cluster behind
            serve.shutdown()
            ray.shutdown()
