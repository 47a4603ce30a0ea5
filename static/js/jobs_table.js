/* The jobs table and the queue (apps/dashboard/jobs_table.py): live rows, live utilization, selection for bulk cancel.

   Rows come from the server, never built here: the page asks for its own URL with ?fragment=rows (answered 304 when
   nothing changed) every few seconds, and at once when /ws/cluster/ says a job changed state. The socket's GPU
   frames update each running job's utilization between fetches. Without a socket (or WebSocket) the fetches alone
   keep the table current; without JavaScript the page is a plain sortable, filterable table whose bulk cancel asks
   on a confirm page. */
(function () {
  "use strict";
  var GC = window.GC;
  var table = document.getElementById("jobs-table");
  var tbody = document.getElementById("jobs-rows");
  if (!table || !tbody || !window.fetch) { return; }
  var statusEl = document.getElementById("live-status");
  var summary = document.getElementById("jobs-summary");
  var pager = document.getElementById("jobs-pager");
  var filter = document.getElementById("jobs-filter");
  var selectAll = document.getElementById("select-all");
  var cancelButton = document.getElementById("cancel-selected");
  var POLL_MS = 5000; /* without a live socket */
  var LIVE_POLL_MS = 15000; /* with one: progress and ETA are not on the cluster stream */
  var live = false, etag = null, timer = null, inFlight = null, again = false;

  function duration(s) { /* as the server's `duration` filter writes it */
    if (s === null || s === undefined || isNaN(s)) { return "—"; }
    if (s < 90) { return Math.round(s) + " s"; }
    if (s < 5400) { return Math.round(s / 60) + " min"; }
    return (s / 3600).toFixed(1) + " h";
  }

  function tickDurations() {
    var now = Date.now() / 1000;
    tbody.querySelectorAll("td[data-since]").forEach(function (td) {
      var text = duration(Math.max(0, now - parseFloat(td.dataset.since)));
      if (td.textContent !== text) { td.textContent = text; }
    });
  }

  function fragmentUrl() {
    var params = new URLSearchParams(location.search);
    params.set("fragment", "rows");
    return location.pathname + "?" + params.toString();
  }

  function selected() {
    var ids = {};
    tbody.querySelectorAll('input[name="ids"]:checked').forEach(function (box) { ids[box.value] = true; });
    return ids;
  }

  function updateSelection() {
    var boxes = tbody.querySelectorAll('input[name="ids"]');
    var checked = tbody.querySelectorAll('input[name="ids"]:checked').length;
    if (cancelButton) {
      cancelButton.disabled = checked === 0;
      cancelButton.textContent = checked ? "Cancel selected (" + checked + ")" : "Cancel selected";
    }
    if (selectAll) {
      selectAll.checked = boxes.length > 0 && checked === boxes.length;
      selectAll.indeterminate = checked > 0 && checked < boxes.length;
    }
  }

  function swap(data) {
    var keep = selected();
    var focused = document.activeElement && tbody.contains(document.activeElement) ? document.activeElement.id : null;
    tbody.innerHTML = data.rows;
    if (window.GC && GC.localizeTimes) { GC.localizeTimes(tbody); }  // the rows' times in the browser's zone
    tbody.querySelectorAll('input[name="ids"]').forEach(function (box) { if (keep[box.value]) { box.checked = true; } });
    if (focused) { var el = document.getElementById(focused); if (el) { el.focus(); } }
    if (summary && data.summary !== undefined && summary.textContent !== data.summary) { summary.textContent = data.summary; }
    if (pager && data.pager !== undefined) { pager.innerHTML = data.pager; }
    tickDurations();
    applyUtil();
    updateSelection();
    table.dispatchEvent(new CustomEvent("jobs:rows", { bubbles: true }));
  }

  function refresh() {
    if (inFlight) { again = true; return inFlight; }
    var headers = { "Accept": "application/json" };
    if (etag) { headers["If-None-Match"] = etag; }
    inFlight = fetch(fragmentUrl(), { headers: headers, credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (response.status === 304) { return null; }
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        etag = response.headers.get("ETag");
        return response.json();
      })
      .then(function (data) { if (data) { swap(data); } })
      .catch(function () { /* the next poll tries again; the rows shown stay */ })
      .then(function () {
        inFlight = null;
        if (again) { again = false; refresh(); }
      });
    return inFlight;
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(function () {
      if (!document.hidden) { refresh(); }
      schedule();
    }, live ? LIVE_POLL_MS : POLL_MS);
  }

  /* at most one fetch a second however many state events arrive (a busy queue sends many) */
  var soon = null;
  function refreshSoon() {
    if (soon) { return; }
    soon = setTimeout(function () { soon = null; refresh(); }, 1000);
  }

  /* --- live utilization from the cluster stream: the mean of the job's GPUs' readings */
  var lastUtil = null; /* the latest frame's readings by GPU: fetched rows get them again */
  function onSample(msg) {
    var util = {};
    (msg.gpus || []).forEach(function (g) {
      if (!g.stale && g.utilization_pct !== null && g.utilization_pct !== undefined) { util[g.uuid] = g.utilization_pct; }
    });
    lastUtil = util;
    applyUtil();
  }

  function applyUtil() {
    if (!lastUtil || !live) { return; }
    var util = lastUtil;
    tbody.querySelectorAll("tr[data-gpus]").forEach(function (tr) {
      var sum = 0, n = 0;
      tr.dataset.gpus.split(" ").forEach(function (uuid) { if (uuid in util) { sum += util[uuid]; n++; } });
      var cell = tr.querySelector('td[data-f="util"]');
      var text = n ? GC.reading(sum / n, " %") : "no data";
      if (cell && cell.textContent !== text) { cell.textContent = text; }
    });
  }

  function onJobState(job) {
    if (!job) { return; }
    var row = tbody.querySelector('tr[data-job="' + job.id + '"]');
    /* a job on the page changed, or one that may now match (a new one, or one entering this page's filter) */
    if (!row || row.dataset.state !== job.state) { refreshSoon(); }
  }

  function say(state, text) {
    if (!statusEl) { return; }
    statusEl.dataset.state = state;
    if (statusEl.textContent !== text) { statusEl.textContent = text; }
  }

  if (GC && "WebSocket" in window) {
    /* the socket's own status line (GC.connect) is kept off the page: this page says what it does instead */
    var socketStatus = document.createElement("span");
    var watcher = new MutationObserver(function () {
      var now = socketStatus.dataset.state === "live";
      say(now ? "live" : "off", now ? "Live" : "Live updates unavailable; the table refreshes every "
        + POLL_MS / 1000 + " s.");
      if (now !== live) { live = now; schedule(); if (live) { refresh(); } }
    });
    watcher.observe(socketStatus, { attributes: true, attributeFilter: ["data-state"] });
    GC.connect("/ws/cluster/", function (msg) {
      if (msg.type === "gpu.sample") { onSample(msg); }
      else if (msg.type === "job.state") { onJobState(msg.job); }
      else if (msg.type === "queue") { if (table.classList.contains("jobs-table-pending")) { refreshSoon(); } }
      else if (msg.type === "resync") { refresh(); }
    }, socketStatus);
  } else {
    say("off", "Live updates unavailable in this browser; the table refreshes every " + POLL_MS / 1000 + " s.");
  }

  /* --- search and filters apply as you type or choose (the form still submits without JavaScript) */
  if (filter) {
    var typing = null;
    var apply = function () {
      var params = new URLSearchParams();
      new FormData(filter).forEach(function (value, name) { if (value !== "") { params.append(name, value); } });
      history.replaceState(null, "", location.pathname + (params.toString() ? "?" + params.toString() : ""));
      /* the sort links carry the filters: rebuild them from the new query */
      table.querySelectorAll("th a[data-sort]").forEach(function (a) {
        var link = new URL(a.href, location.href), q = new URLSearchParams(params);
        q.delete("page");
        q.set("ordering", link.searchParams.get("ordering"));
        a.href = "?" + q.toString();
      });
      var next = document.querySelector('#jobs-table-form input[name="next"]');
      if (next) { next.value = location.pathname + location.search; }
      etag = null;
      refresh();
    };
    filter.addEventListener("input", function (event) {
      if (event.target.name !== "name" && event.target.name !== "user") { return; }
      clearTimeout(typing);
      typing = setTimeout(apply, 350);
    });
    filter.addEventListener("change", function (event) {
      if (event.target.name === "name" || event.target.name === "user") { return; }
      apply();
    });
    filter.addEventListener("submit", function (event) { event.preventDefault(); clearTimeout(typing); apply(); });
  }

  /* --- selection */
  if (selectAll) {
    selectAll.addEventListener("change", function () {
      tbody.querySelectorAll('input[name="ids"]').forEach(function (box) { box.checked = selectAll.checked; });
      updateSelection();
    });
  }
  tbody.addEventListener("change", function (event) { if (event.target.name === "ids") { updateSelection(); } });

  updateSelection();
  tickDurations();
  setInterval(tickDurations, 1000);
  schedule();
})();
