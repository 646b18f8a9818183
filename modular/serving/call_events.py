"""A served call's progress and previews as hub events (``step``, ``block``, ``preview`` with a base64 PNG)."""

from __future__ import annotations

import base64
import io
from typing import Any

from modular.serving.events import EventHub
from modular.serving.jobs import ServedJob
from modular.watch.events import Preview, ProgressEvent

__all__ = ["png_base64", "watch_keywords"]


def png_base64(image: Any) -> str:
    """A PIL image as base64 PNG text, as a preview event carries it."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def watch_keywords(events: EventHub, job: ServedJob, index: int, preview_every: int | None) -> dict[str, Any]:
    """The watching keywords of ``pipe(...)`` for image ``index`` of ``job``: progress (also kept on the job,
    for ``describe``) and, every ``preview_every`` steps (``None``: never), previews."""

    def on_progress(event: ProgressEvent) -> None:
        if event.kind == "step":
            job.progress = {"image": index, "step": event.step, "total": event.total, "stage": event.stage}
            events.publish("step", job.id, image=index, step=event.step, total=event.total, stage=event.stage)
        elif event.kind == "block_started":
            events.publish("block", job.id, image=index, block=event.stage)

    watch: dict[str, Any] = {"on_progress": on_progress}
    if preview_every is not None:

        def on_preview(preview: Preview) -> None:
            png = png_base64(preview.images[0])
            events.publish("preview", job.id, image=index, step=preview.step, total=preview.total, png=png)

        watch.update(preview_every=preview_every, on_preview=on_preview)
    return watch
