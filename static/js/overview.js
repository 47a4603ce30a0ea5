/* Cluster overview: live GPU cells and sparklines from /ws/cluster/. */
(function () {
  "use strict";
  var GC = window.GC;
  var WINDOW_S = 15 * 60;
  var CAPACITY = WINDOW_S; /* one sample a second at most: a fixed-size buffer per GPU */
  var cells = {};
  var rings = {};
  var dirty = {};
  var history = GC.jsonData("gpu-history") || {};

  document.querySelectorAll("li.gpu[data-uuid]").forEach(function (el) {
    var uuid = el.dataset.uuid;
    cells[uuid] = el;
    rings[uuid] = new GC.Ring(CAPACITY);
    (history[uuid] || []).forEach(function (p) { rings[uuid].push(p[0], p[1]); });
    dirty[uuid] = true;
  });

  function heat(v) {
    if (v === null || v === undefined) { return "heat-none"; }
    return "heat-" + Math.min(Math.floor(v / 20), 4);
  }

  function setField(el, name, text) {
    var f = el.querySelector('[data-f="' + name + '"]');
    if (f && f.textContent !== text) { f.textContent = text; }
  }

  function jobText(el, g) {
    var f = el.querySelector('[data-f="job"]');
    if (!f) { return; }
    /* The server names only jobs the user may see (apps/accounts/access.py): another team's is `other_team`. */
    var key = (g.job || "") + "|" + (g.team || "") + "|" + (g.other_team ? 1 : 0);
    if (f.dataset.key === key) { return; }
    f.dataset.key = key;
    f.textContent = "";
    if (!g.job) { f.textContent = g.other_team ? "another team's job" : "idle"; return; }
    var a = document.createElement("a");
    a.href = "/jobs/" + encodeURIComponent(g.job) + "/";
    a.textContent = "job " + g.job;
    f.appendChild(a);
    f.appendChild(document.createTextNode(" · " + (g.team || "") + (g.other_team ? " + another team's job" : "")));
  }

  function setCount(id, n) {
    var el = document.getElementById(id);
    if (el && n !== undefined && el.textContent !== String(n)) { el.textContent = String(n); }
  }

  function onHosts(hosts) {
    /* Each host's status: up, draining, stale (not heard from for a heartbeat timeout) or down. */
    (hosts || []).forEach(function (h) {
      var section = document.querySelector('section.host[data-host="' + CSS.escape(h.name) + '"]');
      var badge = section && section.querySelector('[data-f="host-status"]');
      if (!badge || badge.textContent === h.status) { return; }
      badge.textContent = h.status;
      badge.className = "state state-" + h.status;
      badge.title = h.status === "stale" ? "not heard from for a heartbeat timeout" : "";
    });
  }

  function staleCell(el, g) {
    /* Nothing live backs a GPU of a down or silent host: no readings, no job, no health claim. */
    ["util", "mem", "temp", "power"].forEach(function (name) { setField(el, name, "no data"); });
    var f = el.querySelector('[data-f="job"]');
    if (f && f.dataset.key !== "stale") { f.dataset.key = "stale"; f.textContent = "no live data"; }
    var cls = "gpu heat-none status-" + (g.host_status === "down" ? "down" : "stale");
    if (el.className !== cls) { el.className = cls; }
    var head = el.querySelector(".gpu-head .health");
    if (!head) {
      head = document.createElement("span");
      el.querySelector(".gpu-head").appendChild(head);
    }
    head.className = "health health-stale";
    head.textContent = g.host_status === "down" ? "host down" : "stale";
  }

  function onSample(msg) {
    var busy = 0, idle = 0, stale = 0, down = 0, seen = 0;
    (msg.gpus || []).forEach(function (g) {
      var el = cells[g.uuid];
      var isDown = g.host_status === "down" || g.available === false || g.health === "faulty";
      if (isDown) { down++; } else if (g.stale) { stale++; } else if (g.job || g.other_team) { busy++; } else { idle++; }
      if (!el) { return; }
      seen++;
      if (g.stale) { staleCell(el, g); return; }
      setField(el, "util", GC.reading(g.utilization_pct, " %"));
      setField(el, "mem", g.memory_used_mb === null || g.memory_used_mb === undefined ? "no data"
        : (g.memory_used_mb / 1024).toFixed(1) + "/" + (g.memory_total_mb ? (g.memory_total_mb / 1024).toFixed(1) : "?") + " GiB");
      setField(el, "temp", GC.reading(g.temperature_c, " °C"));
      setField(el, "power", GC.reading(g.power_w, " W"));
      jobText(el, g);
      var cls = "gpu " + heat(g.utilization_pct) + " status-" + (isDown ? "down" : g.job || g.other_team ? "busy" : "idle");
      if (el.className !== cls) { el.className = cls; }
      var head = el.querySelector(".gpu-head .health");
      if (g.health && g.health !== "ok") {
        if (!head) {
          head = document.createElement("span");
          el.querySelector(".gpu-head").appendChild(head);
        }
        head.className = "health health-" + g.health;
        head.textContent = g.health;
      } else if (head) { head.parentNode.removeChild(head); }
      rings[g.uuid].push(g.ts || msg.ts || Date.now() / 1000, g.utilization_pct);
      dirty[g.uuid] = true;
    });
    onHosts(msg.hosts);
    if (msg.counts) {
      /* The server's counters (apps/telemetry/freshness.py): every GPU and every host counted once. */
      var c = msg.counts.gpus || {}, h = msg.counts.hosts || {};
      setCount("t-busy", c.busy); setCount("t-idle", c.idle); setCount("t-stale", c.stale); setCount("t-down", c.down);
      setCount("t-gpus", (c.busy || 0) + (c.idle || 0) + (c.stale || 0) + (c.down || 0));
      setCount("t-hosts-up", (h.up || 0) + (h.draining || 0)); setCount("t-hosts-stale", h.stale);
      setCount("t-hosts-down", h.down);
      if (msg.hosts) { setCount("t-hosts-total", msg.hosts.length); }
    } else if (seen && (msg.gpus || []).length >= Object.keys(cells).length) {
      setCount("t-busy", busy); setCount("t-idle", idle); setCount("t-stale", stale); setCount("t-down", down);
    }
    schedule();
  }

  var pending = false;
  function schedule() {
    if (pending) { return; }
    pending = true;
    requestAnimationFrame(function () {
      pending = false;
      Object.keys(dirty).forEach(function (uuid) {
        var canvas = cells[uuid] && cells[uuid].querySelector("canvas.spark");
        if (canvas) { GC.drawLines(canvas, [rings[uuid]], { min: 0, max: 100, windowS: WINDOW_S, labels: ["utilization"], unit: " %" }); }
      });
      dirty = {};
    });
  }

  function onQueue(msg) {
    var box = document.getElementById("t-queue");
    if (!box) { return; }
    box.textContent = "";
    var teams = Object.keys(msg.teams || {}).sort();
    teams.forEach(function (slug) {
      if (!msg.teams[slug]) { return; }
      var chip = document.createElement("span");
      chip.className = "chip";
      chip.textContent = slug + " " + msg.teams[slug];
      box.appendChild(chip);
      box.appendChild(document.createTextNode(" "));
    });
    if (!box.childNodes.length) { box.textContent = "empty"; }
  }

  function onAlert(msg) {
    GC.alertToast(msg.alert);
    var count = document.getElementById("t-alerts");
    if (count && msg.alert && msg.alert.state === "firing") { count.textContent = String(parseInt(count.textContent, 10) + 1); }
    else if (count && msg.alert && msg.alert.state !== "firing") { count.textContent = String(Math.max(0, parseInt(count.textContent, 10) - 1)); }
  }

  schedule();
  if (Object.keys(cells).length || document.getElementById("t-busy")) {
    GC.connect("/ws/cluster/", function (msg) {
      if (msg.type === "gpu.sample") { onSample(msg); }
      else if (msg.type === "queue") { onQueue(msg); }
      else if (msg.type === "alert") { onAlert(msg); }
    }, document.getElementById("live-status"));
  }
})();
