"""Writing a video's frames to an .mp4 file with diffusers' ``export_to_video`` (imageio and its ffmpeg)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

__all__ = ["VIDEO_SUFFIX", "export_video"]

VIDEO_SUFFIX = ".mp4"


def export_video(frames: Any, path: str | os.PathLike, fps: int = 16) -> Path:
    """Write one video's frames to `path` as an mp4 (H.264 through imageio-ffmpeg); returns the path.

    Args:
        frames: The frames of one video: an array [frames, height, width, 3] in [0, 1] (an ``output_type="np"``
            video), a list of such arrays, or a list of PIL images (``output_type="pil"``).
        path: The file to write (its folder must exist).
        fps: Frames per second (16, as Wan's examples write them).

    Raises:
        ImportError: imageio or imageio-ffmpeg is not installed.
        ValueError: `frames` holds no frames.
    """
    missing = [name for name in ("imageio", "imageio_ffmpeg") if importlib.util.find_spec(name) is None]
    if missing:
        msg = (
            f"writing a video needs {' and '.join(missing)}, which is not installed; install the video extra: "
            'pip install ".[video]"'
        )
        raise ImportError(msg)
    if len(frames) == 0:
        msg = f"export_video: no frames to write to {os.fspath(path)!r}"
        raise ValueError(msg)
    from diffusers.utils import export_to_video

    return Path(export_to_video(list(frames), os.fspath(path), fps=fps))
