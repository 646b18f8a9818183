// The memory chart of the page: bytes over time as inline SVG, drawn with DOM calls (no markup strings).
"use strict";

(() => {
  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = ["#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457"];
  const MIB = 1024 * 1024;
  const mib = (bytes) => `${(bytes / MIB).toFixed(1)} MiB`;

  /** Each device's used bytes over its offload decisions and the host RSS the page sampled (`host`,
   * `{time, rss}` each) on one SVG in `container`; a line of the figures now in `caption`. */
  function draw(container, caption, report, host) {
    const series = report.devices.map((device) => ({
      name: device.device + " used",
      points: device.samples.filter((s) => s.used !== null).map((s) => [s.time, s.used]),
    }));
    series.push({ name: "host RSS", points: host.map((s) => [s.time, s.rss]) });
    const all = series.flatMap((s) => s.points);
    const width = 480;
    const height = 200;
    const pad = 30;
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "memory used over time");
    svg.setAttribute("data-testid", "memory-svg");
    const t0 = Math.min(...all.map((p) => p[0]));
    const t1 = Math.max(...all.map((p) => p[0]));
    const top = Math.max(1, ...all.map((p) => p[1]));
    const x = (t) => pad + ((t - t0) / Math.max(t1 - t0, 1e-9)) * (width - 2 * pad);
    const y = (bytes) => height - pad - (bytes / top) * (height - 2 * pad);
    const text = (tx, ty, content, attributes = {}) => {
      const node = document.createElementNS(SVG, "text");
      node.setAttribute("x", tx);
      node.setAttribute("y", ty);
      node.setAttribute("class", "legend");
      for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
      node.textContent = content;
      svg.append(node);
    };
    const axis = document.createElementNS(SVG, "polyline");
    axis.setAttribute("points", `${pad},${pad} ${pad},${height - pad} ${width - pad},${height - pad}`);
    axis.setAttribute("fill", "none");
    axis.setAttribute("stroke", "#999");
    svg.append(axis);
    text(2, pad - 4, mib(top));
    text(2, height - pad, "0");
    if (all.length > 0) text(width - pad, height - 8, `${(t1 - t0).toFixed(0)} s`, { "text-anchor": "end" });
    series.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      if (s.points.length > 0) {
        const line = document.createElementNS(SVG, "polyline");
        const points = s.points.length === 1 ? [s.points[0], [t1, s.points[0][1]]] : s.points;
        line.setAttribute("points", points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "));
        line.setAttribute("fill", "none");
        line.setAttribute("stroke", color);
        line.setAttribute("stroke-width", "1.5");
        line.setAttribute("data-series", s.name);
        line.setAttribute("data-points", String(s.points.length));
        svg.append(line);
      }
      text(pad + 6, pad + 12 * (i + 1), s.name, { fill: color });
    });
    container.replaceChildren(svg);
    const parts = [`host RSS ${mib(report.host.rss)}`, `host copies ${mib(report.host.host_copies)}`];
    for (const device of report.devices) {
      if (device.used !== null) parts.push(`${device.device} ${mib(device.used)} of ${mib(device.total)}`);
    }
    caption.textContent = parts.join("; ");
  }

  window.memoryChart = { draw };
})();
