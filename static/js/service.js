/* Service page: latency, load and replicas polled from /api/v1/services/<id>/ every 2 s (session cookie). */
(function () {
  "use strict";
  var GC = window.GC;
  var live = GC.jsonData("service-live");

  /* Deleting asks first (the form posts with its CSRF token either way). */
  var del = document.getElementById("delete-form");
  if (del) {
    del.addEventListener("submit", function (event) {
      if (!window.confirm(del.dataset.confirm || "Delete this service?")) { event.preventDefault(); }
    });
  }
  if (!live) { return; }

  var POLL_MS = 2000;
  var EVENTS_EVERY = 3; /* polls between event fetches */
  var WINDOW_S = 30 * 60;
  var CAPACITY = WINDOW_S / 2; /* one point per poll: a fixed-size buffer however long the page stays open */
  var p50 = new GC.Ring(CAPACITY), p95 = new GC.Ring(CAPACITY), p99 = new GC.Ring(CAPACITY);
  var rps = new GC.Ring(CAPACITY), errors = new GC.Ring(CAPACITY);
  var statusEl = document.getElementById("live-status");
  var lastEvent = live.last_event || 0;
  var polls = 0, failures = 0, stopped = false;

  function status(state, text) {
    statusEl.dataset.state = state;
    statusEl.textContent = text;
  }
  function setText(id, text) {
    var el = document.getElementById(id);
    if (el && el.textContent !== text) { el.textContent = text; }
  }
  function pct(v) { return v === null || v === undefined ? "—" : (100 * v).toFixed(v && v < 0.01 ? 2 : 0) + " %"; }

  function draw() {
    var opts = { axis: true, min: 0 }; /* the ring holds the last WINDOW_S seconds */
    GC.drawLines(document.getElementById("chart-latency"), [p50, p95, p99],
      { axis: true, min: 0, labels: ["p50", "p95", "p99"], unit: " ms" });
    GC.drawLines(document.getElementById("chart-rps"), [rps], opts);
    GC.drawLines(document.getElementById("chart-errors"), [errors], opts);
  }

  function replicas(list) {
    var body = document.querySelector("#replicas tbody");
    var key = JSON.stringify(list);
    if (body.dataset.key === key) { return; }
    body.dataset.key = key;
    body.textContent = "";
    if (!list.length) {
      var empty = document.createElement("tr");
      empty.className = "empty";
      var td = document.createElement("td");
      td.colSpan = 3;
      td.textContent = "No replicas.";
      empty.appendChild(td);
      body.appendChild(empty);
      return;
    }
    list.forEach(function (r) {
      var tr = document.createElement("tr");
      tr.dataset.job = r.job;
      var job = document.createElement("td"), state = document.createElement("td"), ready = document.createElement("td");
      var a = document.createElement("a");
      a.href = "/jobs/" + encodeURIComponent(r.job) + "/";
      a.textContent = "job " + r.job;
      job.appendChild(a);
      var chip = document.createElement("span");
      chip.className = "state state-" + r.state;
      chip.textContent = r.state;
      state.appendChild(chip);
      ready.textContent = r.ready ? "ready" : "not ready";
      tr.appendChild(job); tr.appendChild(state); tr.appendChild(ready);
      body.appendChild(tr);
    });
  }

  function apply(s) {
    var st = s.stats || {};
    var t = Date.now() / 1000;
    p50.push(t, st.p50_ms); p95.push(t, st.p95_ms); p99.push(t, st.p99_ms);
    rps.push(t, st.rps);
    errors.push(t, st.error_rate === null || st.error_rate === undefined ? null : 100 * st.error_rate);
    setText("s-p50", GC.reading(st.p50_ms, " ms"));
    setText("s-p95", GC.reading(st.p95_ms, " ms"));
    setText("s-p99", GC.reading(st.p99_ms, " ms"));
    setText("s-rps", GC.fmt(st.rps));
    setText("s-errors", pct(st.error_rate));
    setText("s-queue", String(st.queue_depth === undefined ? 0 : st.queue_depth));
    setText("s-ready", String(st.ready || 0));
    setText("s-desired", String(s.desired_replicas));
    var state = document.getElementById("service-state");
    if (state && s.state && state.textContent !== s.state) {
      state.textContent = s.state;
      state.className = "state state-" + s.state;
    }
    replicas(s.replicas || []);
    requestAnimationFrame(draw);
  }

  function addEvents(list) {
    var box = document.getElementById("service-events");
    list.forEach(function (e) {
      if (e.id <= lastEvent) { return; }
      lastEvent = e.id;
      var li = document.createElement("li");
      li.dataset.id = e.id;
      var time = document.createElement("time");
      time.setAttribute("datetime", e.created_at);
      time.setAttribute("data-when", "seconds");
      time.textContent = GC.when(e.created_at);
      var chip = document.createElement("span");
      chip.className = "chip";
      chip.textContent = e.kind;
      li.appendChild(time);
      li.appendChild(document.createTextNode(" "));
      li.appendChild(chip);
      li.appendChild(document.createTextNode(" " + e.reason));
      box.appendChild(li);
      if (e.kind === "scale_up" || e.kind === "scale_down" || e.kind === "replica_ended") { GC.toast(e.reason, "info"); }
    });
  }

  function fetchJson(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (r.status === 404 || r.status === 401 || r.status === 403) { var err = new Error("gone"); err.gone = r.status; throw err; }
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      return r.json();
    });
  }

  function poll() {
    if (stopped) { return; }
    polls++;
    var wantEvents = polls % EVENTS_EVERY === 1;
    fetchJson("/api/v1/services/" + live.service + "/")
      .then(function (s) {
        failures = 0;
        apply(s);
        status("live", "Live · updated " + GC.when(new Date()));
        if (wantEvents) {
          return fetchJson("/api/v1/services/" + live.service + "/events/?page=last&page_size=100")
            .then(function (body) { addEvents(body.results || []); });
        }
      })
      .catch(function (err) {
        if (err && err.gone) {
          stopped = true;
          status("off", err.gone === 404 ? "This service no longer exists (deleted?); showing data as of the last update."
            : "Live updates stopped: your session has ended; log in again.");
          return;
        }
        failures++;
        status("off", "Live updates unavailable; retrying.");
      })
      .then(function () {
        if (!stopped) { setTimeout(poll, failures ? Math.min(POLL_MS * Math.pow(2, failures), 30000) : POLL_MS); }
      });
  }

  draw();
  poll();
})();
