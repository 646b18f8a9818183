"""Videos out: mp4 files through diffusers' export_to_video, `modular run` on the tiny repo, and the clear errors
when the video extra (ftfy, imageio, imageio-ffmpeg) is missing."""

import importlib.util
import io

import imageio.v3 as iio
import numpy as np
import pytest

from blocks.wan import export_video
from blocks.wan.utils import clean_prompts
from modular.cli.main import main

from ..helpers import STEPS, seeded
from .conftest import VIDEO


def test_export_video_writes_the_frames_as_mp4(wan22_pipe, tmp_path):
    """An 'np' video's frames, and the same video as PIL frames, each make an mp4 of 5 32x32 frames."""
    videos = wan22_pipe(
        prompt="a cat", generator=seeded(0), num_inference_steps=STEPS, output="videos", **VIDEO
    )
    path = export_video(videos[0], tmp_path / "cat.mp4")
    assert path == tmp_path / "cat.mp4"
    frames = iio.imread(path)
    assert frames.shape == (5, 32, 32, 3)
    pil = wan22_pipe(
        prompt="a cat",
        generator=seeded(0),
        num_inference_steps=STEPS,
        output="videos",
        output_type="pil",
        **VIDEO,
    )
    assert export_video(pil[0], tmp_path / "pil.mp4", fps=8).stat().st_size > 0


def test_export_video_refuses_no_frames(tmp_path):
    """An empty list of frames is refused, naming the file."""
    with pytest.raises(ValueError, match="export_video: no frames to write to '.*empty.mp4'"):
        export_video([], tmp_path / "empty.mp4")


def _without(monkeypatch, missing):
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in missing else found(name, *a)
    )


def test_missing_imageio_says_to_install_the_video_extra(monkeypatch, tmp_path):
    """Without imageio-ffmpeg the error names it and the extra to install; nothing is written."""
    _without(monkeypatch, {"imageio_ffmpeg"})
    with pytest.raises(ImportError) as error:
        export_video(np.zeros((5, 32, 32, 3)), tmp_path / "v.mp4")
    assert str(error.value) == (
        'writing a video needs imageio_ffmpeg, which is not installed; install the video extra: pip install ".[video]"'
    )
    assert not (tmp_path / "v.mp4").exists()


def test_missing_ftfy_says_to_install_the_video_extra(monkeypatch):
    """Prompt cleaning without ftfy raises (the classic pipeline would skip its fixes silently)."""
    _without(monkeypatch, {"ftfy"})
    with pytest.raises(ImportError, match=r'needs the ftfy package.*pip install "\.\[video\]"'):
        clean_prompts(["a cat"])


def test_prompts_are_cleaned_as_the_classic_pipeline_cleans_them():
    """HTML entities are unescaped and runs of whitespace collapsed."""
    assert clean_prompts(["  a &amp; b\n\n c  "]) == ["a & b c"]


def test_modular_run_writes_the_tiny_video(tmp_path, capsys):
    """`modular run --family wan` makes the tiny repo's video and saves it as an mp4."""
    out = tmp_path / "out"
    assert main(["run", "--family", "wan", "--output", str(out), "--quiet", "--steps", "2"]) == 0
    assert [path.name for path in out.iterdir()] == ["tiny-repo-seed0-0.mp4"]
    assert f"saved {out / 'tiny-repo-seed0-0.mp4'}" in capsys.readouterr().out
    assert iio.imread(out / "tiny-repo-seed0-0.mp4").shape == (5, 32, 32, 3)


def test_modular_run_streams_the_experts_and_draws_the_memory_picture(tmp_path, capsys):
    """On a simulated device smaller than each expert, `modular run` streams them, saves the video and
    memory.png, and says that the peer's rule (whole models only) cannot run this."""
    out = tmp_path / "out"
    argv = ["run", "--family", "wan", "--output", str(out), "--quiet", "--steps", "2", "--no-table"]
    assert main([*argv, "--offload", "sim", "--budget", "90KiB"]) == 0
    assert sorted(path.name for path in out.iterdir()) == ["memory.png", "tiny-repo-seed0-0.mp4"]
    printed = capsys.readouterr().out
    assert "the peer's rule  cannot run" in printed
    assert (
        "The peer's rule cannot run this: it moves whole models, and a model is larger than the device"
        in (" ".join(printed.split()))
    )


def test_a_batch_entry_stores_a_video_as_npy_and_refuses_png():
    """A job's video is stored exactly as .npy ([frames, H, W, 3]); as PNG it is refused, naming the format to use."""
    from modular.batch.store import encode

    video = np.random.default_rng(0).random((1, 5, 32, 48, 3), dtype=np.float32)
    assert np.array_equal(np.load(io.BytesIO(encode(video, "npy"))), video[0])
    with pytest.raises(ValueError) as error:
        encode(video, "png")
    assert str(error.value) == (
        "a batch entry made a video (5 frames of 48x32), which cannot be stored as png; give the job file format: npy"
    )


def test_modular_run_num_images_is_the_videos_per_prompt(tmp_path):
    """--num-images 2 asks a video family for two videos per prompt (its num_videos_per_prompt): two mp4 files."""
    out = tmp_path / "out"
    argv = ["run", "--family", "wan", "--output", str(out), "--quiet", "--steps", "1", "--num-images", "2"]
    assert main(argv) == 0
    assert sorted(path.name for path in out.iterdir()) == ["tiny-repo-seed0-0.mp4", "tiny-repo-seed0-1.mp4"]
