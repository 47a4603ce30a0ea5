/* Job page: live state, log tail, GPU charts from /ws/jobs/<id>/; metric charts from the stored metrics,
   appended live from GET /api/v1/jobs/<id>/metrics/. */
(function () {
  "use strict";
  var GC = window.GC;
  var live = GC.jsonData("job-live");
  if (!live) { return; }
  var history = GC.jsonData("gpu-history") || {};
  var MAX_LOG_CHARS = 200000;
  var LIVE_POINTS = 3600;
  /* [key, caption, column of the history rows, min, max, unit, scale]: memory in GiB, as everywhere on the pages */
  var GIB = 1 / 1024;
  var METRICS = [["util", "Utilization (%)", 1, 0, 100, " %"], ["mem", "Memory used (GiB)", 2, 0, undefined, " GiB", GIB],
    ["temp", "Temperature (°C)", 3, undefined, undefined, " °C"], ["power", "Power (W)", 4, 0, undefined, " W"]];
  function scaled(m, v) { return v === null || v === undefined || !m[6] ? v : v * m[6]; }
  var FINAL = ["succeeded", "failed", "cancelled"];

  /* GPU charts: one canvas per metric, one line per GPU. GPUs placed after page load are added as they appear. */
  var gpuRings = {}; /* metric -> uuid -> Ring */
  var charts = {};
  var uuids = [];
  var box = document.getElementById("gpu-charts");
  METRICS.forEach(function (m) { gpuRings[m[0]] = {}; });
  function captionText(m) { return m[1] + (uuids.length > 1 ? " — one line per GPU" : ""); }
  function addGpu(u) {
    if (uuids.indexOf(u) >= 0) { return; }
    uuids.push(u);
    var points = history[u] || [];
    METRICS.forEach(function (m) {
      var ring = new GC.Ring(points.length + LIVE_POINTS);
      points.forEach(function (p) { ring.push(p[0], scaled(m, p[m[2]])); });
      gpuRings[m[0]][u] = ring;
      if (!box) { return; }
      if (!charts[m[0]]) {
        var fig = document.createElement("figure");
        var cap = document.createElement("figcaption");
        var canvas = document.createElement("canvas");
        canvas.width = 460; canvas.height = 120;
        canvas.setAttribute("role", "img");
        canvas.setAttribute("aria-label", m[1] + " of the job's GPUs over time");
        fig.appendChild(cap); fig.appendChild(canvas); box.appendChild(fig);
        charts[m[0]] = canvas;
      }
      charts[m[0]].previousSibling.textContent = captionText(m);
    });
    var empty = document.getElementById("gpu-charts-empty");
    if (empty) { empty.hidden = true; }
  }
  live.gpus.forEach(addGpu);
  Object.keys(history).forEach(addGpu);
  function gpuLabel(u) { return u.length > 12 ? u.slice(0, 12) + "…" : u; }
  function drawGpus() {
    METRICS.forEach(function (m) {
      if (!charts[m[0]]) { return; }
      var rings = uuids.map(function (u) { return gpuRings[m[0]][u]; });
      GC.drawLines(charts[m[0]], rings, { axis: true, min: m[3], max: m[4], unit: m[5], labels: uuids.map(gpuLabel) });
    });
  }

  /* Metric charts: the stored series (embedded in the page) drawn on load, then what arrives live appended
     (GET metrics/?since_step=…). One GC.MetricChart per series, in static/js/metric_chart.js. */
  var stored = GC.jsonData("job-metrics") || { series: [], max_points: 2000 };
  var metricBox = document.getElementById("metric-charts");
  var metricCharts = {};
  function addSeries(list) {
    var fresh = false;
    GC.MetricChart.order(list.map(function (s) { return s.name; })).forEach(function (name) {
      var s = list.filter(function (x) { return x.name === name; })[0];
      if (!metricCharts[name]) {
        metricCharts[name] = new GC.MetricChart(metricBox, name, GC.MetricChart.label(name),
          { maxPoints: stored.max_points, min: name === "loss" ? undefined : (s.builtin ? 0 : undefined) });
        fresh = true;
      }
      metricCharts[name].append("job " + live.job, s);
    });
    var empty = document.getElementById("metrics-empty");
    if (empty && Object.keys(metricCharts).length) { empty.hidden = true; }
    return fresh;
  }
  function drawProgress() {
    Object.keys(metricCharts).forEach(function (name) { metricCharts[name].draw(); });
  }
  addSeries(stored.series);
  /* Live append: at most one request in flight and one every 2 s; a report arriving meanwhile asks again. */
  var metricsFetching = false, metricsAgain = false, lastMetricsFetch = 0, metricsTimer = null;
  function fetchMetrics() {
    if (metricsFetching) { metricsAgain = true; return; }
    metricsFetching = true; metricsAgain = false; lastMetricsFetch = Date.now();
    var since = null;
    Object.keys(metricCharts).forEach(function (name) {
      metricCharts[name].lines.forEach(function (l) {
        if (l.lastStep !== null && (since === null || l.lastStep < since)) { since = l.lastStep; }
      });
    });
    var url = "/api/v1/jobs/" + live.job + "/metrics/" + (since === null ? "" : "?since_step=" + since);
    fetch(url, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (body) {
        if (!body) { return; }
        addSeries(body.series);
        drawProgress();
        showProgress(body.progress, body.state);
      })
      .catch(function () {})
      .then(function () {
        metricsFetching = false;
        if (metricsAgain) { soonFetchMetrics(); }
      });
  }
  function soonFetchMetrics() {
    if (metricsTimer) { return; }
    metricsTimer = setTimeout(function () { metricsTimer = null; fetchMetrics(); },
      Math.max(0, 2000 - (Date.now() - lastMetricsFetch)));
  }

  /* Progress percent and ETA, from steps done, max steps and the last rate. */
  function duration(s) {
    if (s < 90) { return Math.round(s) + " s"; }
    if (s < 5400) { return Math.round(s / 60) + " min"; }
    return (s / 3600).toFixed(1) + " h";
  }
  function showProgress(p, state) {
    if (!p) { return; }
    var bar = document.getElementById("job-progress-bar");
    var max = p.max_steps;
    var percent = p.percent;
    if (percent === undefined || percent === null) {
      percent = max ? Math.min(100, Math.round(1000 * p.step / max) / 10) : null;
    }
    setText("job-progress", percent === null ? "—" : percent + " % (" + p.step + " of " + max + " steps)");
    if (bar) { if (percent === null) { bar.removeAttribute("value"); } else { bar.value = percent; } }
    var eta = p.eta_s;
    if (eta === undefined) {
      eta = state === "running" && max && p.steps_per_s > 0 && p.step < max ? (max - p.step) / p.steps_per_s : null;
    }
    setText("job-eta", eta === null || eta === undefined ? "—" : "about " + duration(eta) + " left");
  }

  var log = document.getElementById("job-log");
  var logNext = live.log_next;
  function appendLog(offset, data) {
    if (offset > logNext) { fetchLog(); return; }
    var piece = data.slice(logNext - offset);
    if (!piece) { return; }
    var atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    var text = log.textContent + piece;
    if (text.length > MAX_LOG_CHARS) { text = text.slice(text.length - MAX_LOG_CHARS); }
    log.textContent = text;
    logNext = offset + data.length;
    if (atBottom) { log.scrollTop = log.scrollHeight; }
  }
  var fetching = false;
  function fetchLog() {
    if (fetching) { return; }
    fetching = true;
    fetch("/api/v1/jobs/" + live.job + "/logs/?after=" + logNext, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (body) { if (body && body.data) { appendLog(logNext, body.data); } })
      .catch(function () {})
      .then(function () { fetching = false; });
  }

  function when(iso) { return iso ? GC.when(iso) : "—"; } /* 24-hour, with its zone (console.js) */
  function setText(id, text) {
    var el = document.getElementById(id);
    if (el && el.textContent !== text) { el.textContent = text; }
  }
  function addEvent(from, to) {
    var list = document.getElementById("job-events");
    if (!list) { return; }
    var li = document.createElement("li");
    var time = document.createElement("time");
    var now = new Date();
    time.setAttribute("datetime", now.toISOString());
    time.setAttribute("data-when", "seconds");
    time.textContent = GC.when(now);
    var chip = document.createElement("span");
    chip.className = "state state-" + to;
    chip.textContent = (from || "new") + " → " + to;
    li.appendChild(time); li.appendChild(document.createTextNode(" ")); li.appendChild(chip);
    li.appendChild(document.createTextNode(" (live)"));
    list.appendChild(li);
  }

  function setState(job) {
    var el = document.getElementById("job-state");
    if (job.state && el.textContent !== job.state) {
      addEvent(el.textContent, job.state);
      el.textContent = job.state;
      el.className = "state state-" + job.state;
      GC.toast("Job " + live.job + " is now " + job.state, FINAL.indexOf(job.state) >= 0 && job.state !== "succeeded" ? "warning" : "info");
      var cancel = document.getElementById("cancel-form");
      if (cancel && FINAL.indexOf(job.state) >= 0) { cancel.hidden = true; }
      if (FINAL.indexOf(job.state) >= 0) { fetchMetrics(); } /* the last records, and no ETA */
    }
    var pending = document.getElementById("job-pending");
    pending.hidden = job.state !== "queued";
    if (job.pending_reason !== undefined) {
      document.getElementById("job-pending-reason").textContent = job.pending_reason || "—";
    }
    if (job.steps_done !== undefined) { document.getElementById("job-steps").textContent = job.steps_done; }
    if (job.started_at !== undefined) { setText("job-started", when(job.started_at)); }
    if (job.finished_at !== undefined) { setText("job-finished", when(job.finished_at)); }
    if (job.exit_code !== undefined) { setText("job-exit", job.exit_code === null ? "—" : String(job.exit_code)); }
    if (job.attempts !== undefined) { setText("job-attempts", String(job.attempts)); }
    if (job.allocations && job.allocations.length) {
      setText("job-placed", job.allocations.map(function (a) {
        return a.host + ":" + a.index + " (" + a.gpu_type + ")";
      }).join(", "));
      job.allocations.forEach(function (a) { addGpu(a.uuid); });
    }
  }

  function onProgress(msg) {
    if (msg.step !== undefined && msg.step !== null) { document.getElementById("job-steps").textContent = msg.step; }
    document.getElementById("job-sps").textContent = GC.fmt(msg.steps_per_s);
    var samples = document.getElementById("job-samples-ps");
    if (samples) { samples.textContent = GC.fmt(msg.samples_per_s); }
    document.getElementById("job-loss").textContent = msg.loss === null || msg.loss === undefined ? "no data" : GC.fmt(msg.loss);
    showProgress({ step: msg.step, max_steps: live.max_steps, steps_per_s: msg.steps_per_s },
      document.getElementById("job-state").textContent);
    soonFetchMetrics();
  }

  function onSample(msg) {
    (msg.gpus || []).forEach(function (g) {
      if (uuids.indexOf(g.uuid) < 0) {
        if (g.job !== live.job) { return; }
        addGpu(g.uuid);
      }
      var t = g.ts || msg.ts;
      gpuRings.util[g.uuid].push(t, g.utilization_pct);
      gpuRings.mem[g.uuid].push(t, scaled(METRICS[1], g.memory_used_mb));
      gpuRings.temp[g.uuid].push(t, g.temperature_c);
      gpuRings.power[g.uuid].push(t, g.power_w);
    });
    if (!pendingDraw) { pendingDraw = true; requestAnimationFrame(function () { pendingDraw = false; drawGpus(); }); }
  }
  var pendingDraw = false;

  drawGpus();
  drawProgress();
  log.scrollTop = log.scrollHeight;
  if (!live.final) {
    GC.connect("/ws/jobs/" + live.job + "/", function (msg) {
      if (msg.type === "job.state" && msg.job) { setState(msg.job); }
      else if (msg.type === "job.log") { appendLog(msg.offset, msg.data || ""); }
      else if (msg.type === "job.progress") { onProgress(msg); }
      else if (msg.type === "gpu.sample") { onSample(msg); }
    }, document.getElementById("live-status"));
  }
})();
