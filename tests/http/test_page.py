"""The page at ``/`` in a real browser (Debian's chromium driven by Playwright) over a real server.

A person's session: submit from the form, see previews arrive, pause, queue and cancel with the Cancel
button, resume, and get the gallery's images, which equal the direct call's PNG. The page fetches nothing
from another origin. Outside CI the tests skip when chromium or Playwright is missing; in CI (``CI`` set,
as ``.ci/run`` does) they fail instead.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import PIL.Image
import pytest

from components import ComponentsManager
from modular.batch.jobs import Job, call_job
from modular.batch.store import encode
from modular.http import ServerSettings, make_app, start_server
from modular.serving import Scheduler, ServedWorkflows, parse_served

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
NOTES = Path("/work/notes")
WAIT_MS = 30_000  # the longest any one thing on the page may take to appear (a bound, not a measure)


def _browser_missing() -> str | None:
    if not CHROMIUM.is_file():
        return f"{CHROMIUM} is missing (Debian: apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    return None


@pytest.fixture
def needs_browser() -> None:
    """Skips the test when chromium or Playwright is missing; fails it instead in CI (``CI`` set)."""
    missing = _browser_missing()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the page's browser tests: {missing}")
        pytest.skip(missing)


@pytest.fixture
def browser_page(needs_browser: None, tmp_path: Path) -> Iterator[Any]:
    """A fresh chromium page (its own profile under ``tmp_path``) with every request it makes recorded in
    ``page.requested`` and its script errors in ``page.problems``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 1100},
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(WAIT_MS)
            page.requested = []  # type: ignore[attr-defined]
            page.on("request", lambda request: page.requested.append(request.url))
            problems: list[str] = []
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.problems = problems  # type: ignore[attr-defined]
            yield page
        finally:
            context.close()


class PageServer:
    """A scheduler and its server on a free loopback port, serving a tiny Stable Diffusion repo whole
    (``tiny-sd``: its auto blocks choose by the inputs) and as text to image (``tiny-sd-text``)."""

    def __init__(self, root: Path, token: str | None = None) -> None:
        from blocks.stable_diffusion import make_tiny_repo

        self.repo = make_tiny_repo(root / "tiny-sd")
        self.manager = ComponentsManager()
        workflows = [
            parse_served(f"tiny-sd={self.repo}"),
            parse_served(f"tiny-sd-text={self.repo}:text2image"),
        ]
        self.served = ServedWorkflows(workflows, self.manager)
        self.scheduler = Scheduler(self.served, root / "state")
        self.scheduler.start()
        self.settings = ServerSettings(port=0, token=token)
        try:
            self.server = start_server(make_app(self.scheduler, self.settings), self.settings)
        except BaseException:
            self.scheduler.close()
            raise
        self.url = self.server.url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.scheduler.close()

    def direct_png(self, inputs: dict[str, Any], seed: int) -> bytes:
        """The PNG the direct call makes on the served pipeline (once the queue is idle)."""
        assert self.scheduler.wait_idle(60)
        pipe = self.served.load("tiny-sd")
        return encode(call_job(pipe, Job("direct", str(self.repo), None, inputs, seed)), "png")


@pytest.fixture
def page_server(needs_browser: None, tmp_path: Path) -> Iterator[PageServer]:
    """A server for the page; asked for before ``browser_page``, so the browser closes first."""
    server = PageServer(tmp_path)
    try:
        yield server
    finally:
        server.close()


def open_page(page: Any, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#workflow[data-ready='1']", state="attached")
    page.wait_for_selector("#connection[data-live='1']", state="attached")


def fill_form(page: Any, **fields: str) -> None:
    for name, value in fields.items():
        page.fill(f"[data-testid='field-{name}']", value)


def submit(page: Any) -> str:
    """Click Submit and return the new job's id (the status line names it)."""
    before = page.get_attribute("#submit-status", "data-job-id")
    page.click("[data-testid='submit']")
    page.wait_for_function(
        "before => { const id = document.getElementById('submit-status').dataset.jobId;"
        " return id !== undefined && id !== before; }",
        arg=before,
    )
    job_id = page.get_attribute("#submit-status", "data-job-id")
    assert job_id
    return job_id


def row(page: Any, job_id: str) -> Any:
    return page.locator(f"tr[data-testid='job-row'][data-job-id='{job_id}']")


def wait_state(page: Any, job_id: str, state: str) -> None:
    page.wait_for_function(
        "([id, state]) => { const row = document.querySelector(`tr[data-job-id='${id}'] [data-testid=job-state]`);"
        " return row !== null && row.textContent === state; }",
        arg=[job_id, state],
    )


def gallery_png(page: Any, job_id: str, index: int = 0) -> bytes:
    """The bytes behind the gallery's <img> of ``job_id``, fetched by the page from the src it shows."""
    selector = f"figure[data-testid='result'][data-job-id='{job_id}'][data-index='{index}'] img"
    page.wait_for_selector(selector)
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=page.query_selector(selector))
    text = page.evaluate(
        """async (selector) => {
            const src = document.querySelector(selector).src;
            const bytes = new Uint8Array(await (await fetch(src)).arrayBuffer());
            let binary = "";
            for (const byte of bytes) binary += String.fromCharCode(byte);
            return btoa(binary);
        }""",
        selector,
    )
    return base64.b64decode(text)


def save_screenshot(page: Any, path: Path) -> None:
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0
    try:  # a copy for the notes when that folder takes files; never a reason to fail
        NOTES.mkdir(parents=True, exist_ok=True)
        if os.access(NOTES, os.W_OK):
            shutil.copyfile(path, NOTES / "serve_page.png")
    except OSError:
        pass


@pytest.mark.slow
def test_a_session_on_the_page(page_server: PageServer, browser_page: Any, tmp_path: Path) -> None:
    page, server = browser_page, page_server
    open_page(page, server.url + "/")
    assert page.input_value("#workflow") == "tiny-sd"
    # The form draws the workflow's own inputs: tiny-sd takes size, steps and guidance, and images.
    drawn = ("prompt", "negative_prompt", "size", "steps", "guidance_scale", "seed", "image", "mask_image")
    for name in drawn:
        assert page.locator(f"[data-testid='field-{name}']").count() == 1, name
    assert page.get_attribute("[data-testid='field-image']", "type") == "file"
    # Another workflow's form has that workflow's inputs: text to image takes no image and no strength.
    fill_form(page, steps="3")
    page.select_option("#workflow", "tiny-sd-text")
    assert page.input_value("[data-testid='field-steps']") == "3"  # what was typed stays
    assert page.locator("[data-testid='field-steps']").count() == 1
    assert page.locator("[data-testid='field-image']").count() == 0
    assert page.locator("[data-testid='field-strength']").count() == 0
    page.select_option("#workflow", "tiny-sd")
    assert page.locator("[data-testid='field-strength']").count() == 1

    # A bad request: the server's message is shown, nothing is queued.
    fill_form(page, prompt="a fox", size="3x")
    # Past the browser's own check of the field, to the server's.
    page.evaluate("document.getElementById('field-size').removeAttribute('pattern')")
    page.click("[data-testid='submit']")
    page.wait_for_selector("#error:not([hidden])")
    assert "'size'" in page.inner_text("#error")
    assert server.client.get("/v1/jobs").json() == []

    # A job from the form runs; its previews arrive and the page shows the latest.
    fields = {"prompt": "a red fox", "negative_prompt": "blurry", "size": "32x32", "steps": "2"}
    fill_form(page, **fields, guidance_scale="6.5", seed="11")
    with server.scheduler.events.subscribe(None) as listener:  # every event, as the page's stream sees them
        first = submit(page)
        assert page.is_hidden("#error")
        wait_state(page, first, "done")
        published = list(iter(lambda: listener.get(timeout=0), None))
    previews = [event for event in published if event["kind"] == "preview" and event["job"] == first]
    assert len(previews) >= 2, "each step of the job made a preview"
    # The page counts each preview and ends on the job's latest (a bound on waiting, not a time).
    latest = "data:image/png;base64," + previews[-1]["png"]
    page.wait_for_function("src => document.getElementById('preview').src === src", arg=latest)
    assert page.inner_text("#preview-count") == str(len(previews))
    gallery_png(page, first)
    assert page.get_attribute("#preview", "data-job-id") == first
    page.wait_for_function(
        "() => document.getElementById('manager').textContent.includes('UNet2DConditionModel')"
    )
    page.wait_for_selector("[data-testid='memory-svg'] polyline[data-series='host RSS']")

    # Paused, two jobs wait; one is cancelled with its Cancel button, the other runs after Resume.
    page.click("[data-testid='pause']")
    page.wait_for_selector("#queue-state[data-paused='1']", state="attached")
    assert server.client.get("/v1/queue").json()["paused"] is True
    markup = '<img src="http://elsewhere.invalid/x.png" data-injected="1">'  # a prompt is shown as text
    fill_form(page, prompt=markup, seed="21")
    second = submit(page)
    assert row(page, second).locator("td.prompt").inner_text() == markup
    assert page.locator("[data-injected]").count() == 0
    fill_form(page, prompt="a red fox", seed="31")
    third = submit(page)
    page.wait_for_function(
        "id => document.querySelector(`tr[data-job-id='${id}'] [data-testid=job-position]`)?.textContent === '2'",
        arg=third,
    )
    assert row(page, second).locator("[data-testid='job-position']").inner_text() == "1"
    row(page, second).locator("[data-testid='cancel']").click()
    wait_state(page, second, "cancelled")
    assert server.client.get(f"/v1/jobs/{second}").json()["state"] == "cancelled"
    assert row(page, second).locator("[data-testid='cancel']").count() == 0
    page.wait_for_function(
        "id => document.querySelector(`tr[data-job-id='${id}'] [data-testid=job-position]`)?.textContent === '1'",
        arg=third,
    )
    assert server.client.get(f"/v1/jobs/{third}").json()["state"] == "queued"
    page.click("[data-testid='resume']")
    wait_state(page, third, "done")
    page.wait_for_selector("#queue-state[data-paused='0']", state="attached")
    assert page.locator(f"figure[data-testid='result'][data-job-id='{second}']").count() == 0

    # The gallery's images are the direct call's PNGs (entry 0 of a job is made with its seed).
    first_png, third_png = gallery_png(page, first), gallery_png(page, third)
    save_screenshot(page, tmp_path / "page.png")
    inputs = {
        "prompt": "a red fox",
        "negative_prompt": "blurry",
        "num_inference_steps": 2,
        "width": 32,
        "height": 32,
        "guidance_scale": 6.5,
    }
    assert first_png == server.direct_png(inputs, 11)
    assert third_png == server.direct_png(inputs, 31)
    assert first_png != third_png

    # Nothing came from elsewhere, and the page's policy would refuse it if a script asked.
    assert "default-src 'self'" in server.client.get("/").headers["content-security-policy"]
    origin = server.url + "/"
    outside = [url for url in page.requested if not url.startswith((origin, "data:"))]
    assert outside == [], "the page fetched from outside its server"
    assert any(url.startswith(server.url + "/v1/events") for url in page.requested)
    assert page.problems == []  # no script errors


def test_the_page_sends_its_token(browser_page: Any, tmp_path: Path) -> None:
    server = PageServer(tmp_path, token="page-secret-0123456789")
    try:
        page = browser_page
        assert page.goto(server.url + "/").status == 401  # without the token the page is refused
        open_page(page, server.url + "/?token=page-secret-0123456789")
        fill_form(page, prompt="a cat", size="32x32", steps="1", seed="4")
        job_id = submit(page)
        wait_state(page, job_id, "done")
        png = gallery_png(page, job_id)
        assert png == server.client.get(f"/v1/jobs/{job_id}/result").content
        assert page.is_hidden("#error")

        # An input image goes as a file of a multipart form, and the call takes it as the direct call does.
        picture = PIL.Image.new("RGB", (32, 32))
        picture.putdata([(8 * x, 8 * y, 128) for y in range(32) for x in range(32)])
        buffer = io.BytesIO()
        picture.save(buffer, format="PNG")
        upload = buffer.getvalue()
        page.set_input_files(
            "[data-testid='field-image']",
            files=[{"name": "in.png", "mimeType": "image/png", "buffer": upload}],
        )
        fill_form(page, steps="4", strength="0.5", seed="6")
        image_job = submit(page)
        wait_state(page, image_job, "done")
        stored = server.scheduler.uploads / f"{hashlib.sha256(upload).hexdigest()}.png"
        assert stored.read_bytes() == upload
        inputs = {"prompt": "a cat", "num_inference_steps": 4, "width": 32, "height": 32, "strength": 0.5}
        direct = server.direct_png({**inputs, "image": PIL.Image.open(io.BytesIO(upload)).convert("RGB")}, 6)
        assert gallery_png(page, image_job) == direct
        assert direct != server.direct_png(inputs, 6)  # the image changed the call

        # Fetches carry the header, the stream and the images the query parameter; the script and style
        # need neither.
        for url in page.requested:
            if "/v1/" in url and ("/v1/events" in url or "/result" in url):
                assert "token=page-secret-0123456789" in url, url
        assert page.problems == []
    finally:
        browser_page.goto("about:blank")  # the page's event stream closes before the server stops
        server.close()


def test_the_memory_chart_draws_each_device(page_server: PageServer, browser_page: Any) -> None:
    # A CPU server has no offload engine, so its report has no device; this one is answered by the browser
    # itself with two devices' decisions (one without a total, whose used bytes are unknown).
    report = page_server.client.get("/v1/memory").json()
    assert report["devices"] == []
    now = time.time()
    samples = [
        {"time": now - 10 + i, "model": f"m{i}", "used": (i + 1) * 2**20, "reason": "load"} for i in range(3)
    ]
    report["devices"] = [
        {"device": "cuda:0", "total": 2**30, "used": 3 * 2**20, "resident": ["m2"], "samples": samples},
        {
            "device": "mps",
            "total": None,
            "used": None,
            "resident": [],
            "samples": [{**samples[0], "used": None}],
        },
    ]
    page = browser_page
    page.route(f"{page_server.url}/v1/memory", lambda route: route.fulfill(json=report))
    open_page(page, page_server.url + "/")
    page.wait_for_selector("[data-testid='memory-svg'] polyline[data-series='cuda:0 used']")
    assert page.get_attribute("polyline[data-series='cuda:0 used']", "data-points") == "3"
    assert page.locator("polyline[data-series='mps used']").count() == 0  # no known bytes: no line
    assert page.locator("polyline[data-series='host RSS']").count() == 1
    assert "cuda:0 3.0 MiB of 1024.0 MiB" in page.inner_text("#memory-text")
    assert page.problems == []
