// The page of `modular serve`: the queue, the running job, results, the manager and memory, and a job form.
// Plain DOM, no build step, nothing fetched from another origin. Text from the server is set with
// textContent (never innerHTML), so a prompt or an error message cannot inject markup.
"use strict";

(() => {
  const token = new URLSearchParams(window.location.search).get("token");
  const HOST_POLL_MS = 3000; // how often the page samples the host's RSS (GET /v1/memory)
  const HOST_SAMPLES = 400; // the latest host samples the chart keeps
  const FINAL = new Set(["done", "failed", "cancelled"]);

  const state = {
    jobs: new Map(), // id -> the job as GET /v1/jobs describes it (positions and progress kept current)
    order: [], // ids in arrival order
    workflows: new Map(), // name -> GET /v1/workflows entry
    shown: new Set(), // "<id>-<index>" of results in the gallery
    previews: 0,
    previewJob: null,
    host: [], // {time, rss} sampled by this page
  };

  const $ = (id) => document.getElementById(id);

  /** `url` with this page's token as a query parameter (for EventSource and <img>, which send no headers). */
  function withToken(url) {
    if (!token) return url;
    return url + (url.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token);
  }

  /** A fetch of this server; returns the JSON (or text) body, throws an Error with the server's message. */
  async function api(method, path, { body, text = false } = {}) {
    const headers = {};
    if (token) headers.Authorization = "Bearer " + token;
    const init = { method, headers };
    if (body instanceof FormData) {
      init.body = body;
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (error) {
      throw new Error(`${method} ${path}: the server did not answer (${error.message})`);
    }
    if (!response.ok) {
      let message = `${method} ${path}: HTTP ${response.status}`;
      try {
        const data = await response.json();
        if (data && data.error && data.error.message) message = data.error.message;
      } catch (ignored) {
        // not JSON: keep the status line
      }
      throw new Error(message);
    }
    return text ? response.text() : response.json();
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message;
    box.hidden = false;
  }

  function clearError() {
    $("error").hidden = true;
    $("error").textContent = "";
  }

  function element(tag, attributes = {}, text) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // -- the job form -------------------------------------------------------------------------------
  const IMAGE_TYPE = /PIL\.Image/;

  /** The form's fields for one workflow, from its inputs (GET /v1/workflows). */
  function drawFields(workflow) {
    const names = new Map(workflow.inputs.map((input) => [input.name, input]));
    const fields = $("fields");
    // What was typed stays when another workflow is chosen (files are chosen again).
    const typed = new Map([...fields.querySelectorAll("textarea, input:not([type=file])")].map((c) => [c.name, c.value]));
    fields.replaceChildren();
    const placeholder = (name) => {
      const input = names.get(name);
      return input && input.default !== null && input.default !== undefined ? String(input.default) : "";
    };
    const add = (id, label, control) => {
      const row = element("p");
      control.id = "field-" + id;
      control.name = id;
      control.setAttribute("data-testid", "field-" + id);
      if (control.type !== "file" && typed.has(id)) control.value = typed.get(id);
      row.append(element("label", { for: control.id }, label), control);
      fields.append(row);
    };
    const number = (attributes) => element("input", { type: "number", ...attributes });
    add("prompt", "Prompt", element("textarea", { rows: "2", required: "" }));
    if (names.has("negative_prompt")) add("negative_prompt", "Negative prompt", element("textarea", { rows: "1" }));
    if (names.has("width") && names.has("height")) {
      add("size", "Size (WIDTHxHEIGHT)", element("input", { type: "text", placeholder: "512x512", pattern: "[0-9]+x[0-9]+" }));
    }
    if (names.has("num_inference_steps")) {
      add("steps", "Steps", number({ min: "1", step: "1", placeholder: placeholder("num_inference_steps") }));
    }
    if (names.has("guidance_scale")) {
      add("guidance_scale", "Guidance scale", number({ step: "any", placeholder: placeholder("guidance_scale") }));
    }
    if (names.has("strength")) add("strength", "Strength", number({ min: "0", max: "1", step: "any" }));
    add("seed", "Seed", number({ min: "0", step: "1", placeholder: "random" }));
    add("images_per_prompt", "Images", number({ min: "1", step: "1", placeholder: "1" }));
    for (const input of workflow.inputs) {
      if (IMAGE_TYPE.test(input.type) && !input.name.endsWith("_embeds")) {
        const file = element("input", { type: "file", accept: "image/png,image/jpeg,image/webp" });
        add(input.name, `Image: ${input.name}`, file);
        file.dataset.image = "1";
        if (input.description) file.title = input.description;
      }
    }
  }

  /** The request the form says (JSON values), and the image files chosen, by input name. */
  function readForm() {
    const data = { workflow: $("workflow").value };
    const files = new Map();
    const value = (id) => {
      const control = $("field-" + id);
      return control ? control.value.trim() : "";
    };
    if (value("prompt") !== "") data.prompt = $("field-prompt").value;
    if (value("negative_prompt") !== "") data.negative_prompt = $("field-negative_prompt").value;
    if (value("size") !== "") data.size = value("size");
    for (const id of ["steps", "seed", "images_per_prompt"]) {
      if (value(id) !== "") data[id] = Number.parseInt(value(id), 10);
    }
    if (value("guidance_scale") !== "") data.guidance_scale = Number(value("guidance_scale"));
    if (value("strength") !== "") data.inputs = { strength: Number(value("strength")) };
    for (const control of $("fields").querySelectorAll("input[type=file]")) {
      if (control.files.length > 0) files.set(control.name, control.files[0]);
    }
    return { data, files };
  }

  async function submitJob(event) {
    event.preventDefault();
    const { data, files } = readForm();
    let body = data;
    if (files.size > 0) {
      // Images go as files of a multipart form; the JSON request is its field "request".
      body = new FormData();
      body.append("request", JSON.stringify(data));
      for (const [name, file] of files) body.append(name, file, file.name);
    }
    const status = $("submit-status");
    $("submit").disabled = true;
    try {
      const job = await api("POST", "/v1/jobs", { body });
      clearError();
      status.textContent = `Job ${job.id} is ${job.state}` + (job.position ? ` at position ${job.position}` : "");
      status.dataset.jobId = job.id;
      refreshJobs();
    } catch (error) {
      showError(error.message);
    } finally {
      $("submit").disabled = false;
    }
  }

  async function loadWorkflows() {
    const list = await api("GET", "/v1/workflows");
    const select = $("workflow");
    select.replaceChildren();
    for (const workflow of list) {
      state.workflows.set(workflow.name, workflow);
      select.append(element("option", { value: workflow.name }, `${workflow.name} (${workflow.family})`));
    }
    if (list.length > 0) drawFields(list[0]);
    select.dataset.ready = "1";
  }

  // -- the queue ----------------------------------------------------------------------------------
  let refreshing = null;
  let refreshAgain = false;

  /** GET /v1/jobs, coalesced: a refresh asked for while one runs runs once after it. */
  function refreshJobs() {
    if (refreshing) {
      refreshAgain = true;
      return refreshing;
    }
    refreshing = (async () => {
      do {
        refreshAgain = false;
        try {
          const jobs = await api("GET", "/v1/jobs");
          state.jobs = new Map(jobs.map((job) => [job.id, job]));
          state.order = jobs.map((job) => job.id);
          renderJobs();
          renderRunning();
          renderGallery();
        } catch (error) {
          showError(error.message);
        }
      } while (refreshAgain);
      refreshing = null;
    })();
    return refreshing;
  }

  async function cancelJob(id) {
    try {
      await api("DELETE", "/v1/jobs/" + encodeURIComponent(id));
      clearError();
    } catch (error) {
      showError(error.message);
    }
    refreshJobs();
  }

  function renderJobs() {
    const body = $("jobs-body");
    body.replaceChildren();
    for (const id of state.order) {
      const job = state.jobs.get(id);
      const row = element("tr", { "data-testid": "job-row", "data-job-id": id, class: "state-" + job.state });
      row.append(element("td", { title: id }, id));
      row.append(element("td", {}, job.workflow));
      const stateCell = element("td");
      stateCell.append(element("span", { "data-testid": "job-state" }, job.state));
      if (job.error) stateCell.append(element("div", { class: "job-error" }, job.error));
      row.append(stateCell);
      const position = job.position === null || job.position === undefined ? "" : String(job.position);
      row.append(element("td", { "data-testid": "job-position" }, position));
      const prompt = job.request && typeof job.request.prompt === "string" ? job.request.prompt : "";
      row.append(element("td", { class: "prompt", title: prompt }, prompt));
      const action = element("td");
      if (job.state === "queued" || job.state === "running") {
        const button = element("button", { type: "button", "data-testid": "cancel", "aria-label": `Cancel job ${id}` }, "Cancel");
        button.addEventListener("click", () => {
          button.disabled = true;
          cancelJob(id);
        });
        action.append(button);
      }
      row.append(action);
      body.append(row);
    }
  }

  function setPaused(paused) {
    $("queue-state").textContent = paused ? "paused" : "running";
    $("queue-state").dataset.paused = paused ? "1" : "0";
    $("pause").disabled = paused;
    $("resume").disabled = !paused;
  }

  async function pauseOrResume(action) {
    try {
      const answer = await api("POST", "/v1/queue/" + action);
      setPaused(answer.paused);
      clearError();
    } catch (error) {
      showError(error.message);
    }
  }

  // -- the running job ----------------------------------------------------------------------------
  function renderRunning() {
    const running = state.order.map((id) => state.jobs.get(id)).find((job) => job.state === "running");
    const label = $("running-job");
    if (!running) {
      label.textContent = "nothing runs";
      delete label.dataset.jobId;
      return;
    }
    label.textContent = `${running.id} (${running.workflow}): ${running.request.prompt || ""}`;
    label.dataset.jobId = running.id;
    const progress = running.progress || {};
    if (progress.total) {
      $("progress").max = progress.total;
      $("progress").value = progress.step;
      const image = running.images > 1 ? `image ${progress.image + 1} of ${running.images}, ` : "";
      $("progress-text").textContent = `${image}step ${progress.step} of ${progress.total}`;
    }
  }

  function onStep(event) {
    const job = state.jobs.get(event.job);
    if (job) {
      job.progress = { image: event.image, step: event.step, total: event.total, stage: event.stage };
      if (job.state !== "running" && !FINAL.has(job.state)) job.state = "running";
    }
    renderRunning();
  }

  function onPreview(event) {
    const preview = $("preview");
    preview.src = "data:image/png;base64," + event.png;
    preview.alt = `preview of job ${event.job}, image ${event.image + 1}, step ${event.step} of ${event.total}`;
    preview.hidden = false;
    preview.dataset.jobId = event.job;
    preview.dataset.step = String(event.step);
    state.previews += 1;
    $("preview-count").textContent = String(state.previews);
  }

  // -- results ------------------------------------------------------------------------------------
  function renderGallery() {
    const gallery = $("gallery");
    for (const id of state.order) {
      const job = state.jobs.get(id);
      (job.results || []).forEach((name, index) => {
        const key = `${id}-${index}`;
        if (state.shown.has(key)) return;
        state.shown.add(key);
        const src = withToken(`/v1/jobs/${encodeURIComponent(id)}/result?index=${index}`);
        const figure = element("figure", { "data-testid": "result", "data-job-id": id, "data-index": String(index) });
        const prompt = (job.request && job.request.prompt) || "";
        figure.append(element("img", { src, alt: `result ${index + 1} of job ${id}: ${prompt}`, width: "128", height: "128" }));
        figure.append(element("figcaption", {}, `${id} #${index} seed ${job.seeds[index]}`));
        gallery.prepend(figure);
      });
    }
  }

  // -- the manager and memory ---------------------------------------------------------------------
  async function refreshManager() {
    try {
      $("manager").textContent = await api("GET", "/v1/manager?format=text", { text: true });
    } catch (error) {
      showError(error.message);
    }
  }

  async function refreshMemory() {
    try {
      const report = await api("GET", "/v1/memory");
      state.host.push({ time: Date.now() / 1000, rss: report.host.rss });
      if (state.host.length > HOST_SAMPLES) state.host.splice(0, state.host.length - HOST_SAMPLES);
      window.memoryChart.draw($("memory-chart"), $("memory-text"), report, state.host);
    } catch (error) {
      showError(error.message);
    }
  }

  // -- the event stream ---------------------------------------------------------------------------
  function connect() {
    const source = new EventSource(withToken("/v1/events"));
    source.onopen = () => {
      $("connection").textContent = "live";
      $("connection").dataset.live = "1";
      refreshJobs(); // what happened while the stream was closed
    };
    source.onerror = () => {
      $("connection").textContent = "reconnecting…";
      $("connection").dataset.live = "0";
    };
    const on = (kind, handle) =>
      source.addEventListener(kind, (message) => {
        handle(JSON.parse(message.data));
      });
    for (const kind of ["queued", "started", "requeued"]) on(kind, () => refreshJobs());
    for (const kind of FINAL) {
      on(kind, () => {
        refreshJobs();
        refreshManager();
        refreshMemory();
      });
    }
    on("position", (event) => {
      const job = state.jobs.get(event.job);
      if (job) {
        job.position = event.position;
        renderJobs();
      }
    });
    on("step", onStep);
    on("preview", onPreview);
    on("paused", () => setPaused(true));
    on("resumed", () => setPaused(false));
  }

  async function start() {
    $("job-form").addEventListener("submit", submitJob);
    $("workflow").addEventListener("change", () => drawFields(state.workflows.get($("workflow").value)));
    $("pause").addEventListener("click", () => pauseOrResume("pause"));
    $("resume").addEventListener("click", () => pauseOrResume("resume"));
    try {
      await loadWorkflows();
      const queue = await api("GET", "/v1/queue");
      setPaused(queue.paused);
    } catch (error) {
      showError(error.message);
    }
    connect();
    refreshManager();
    refreshMemory();
    window.setInterval(refreshMemory, HOST_POLL_MS);
  }

  start();
})();
