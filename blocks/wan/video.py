"""Frames to an .mp4 file, as diffusers writes them (``diffusers.utils.export_to_video``)."""

from __future__ import annotations

from modular.batch.video import export_video

__all__ = ["export_video"]
