/* History charts: a range picker (1 h, 24 h, 7 d, custom), series from the metrics API, live append for a
   "last …" range. Each chart is drawn by one function in CHARTS (canvas, columns): swap the drawing there. */
(function () {
  "use strict";
  var GC = window.GC;
  var RANGES = { "1h": 3600, "24h": 86400, "7d": 7 * 86400 };
  var OVERLAP = 6; /* buckets read again on each live tick */
  var COLORS = ["#0b5cad", "#b35900", "#2b7a0b", "#8a3ffc", "#b42318"];

  function ring(t, values, scale) {
    var r = new GC.Ring(Math.max(t.length, 1));
    for (var i = 0; i < t.length; i++) {
      var v = values ? values[i] : null;
      r.push(t[i], v === null || v === undefined ? null : v * (scale || 1));
    }
    return r;
  }

  function fit(canvas) {
    /* Draw at the displayed size, sharp on high-density screens. */
    var ratio = window.devicePixelRatio || 1, w = Math.max(canvas.clientWidth, 100);
    var h = Math.round(w / 4);
    if (canvas.width !== Math.round(w * ratio)) { canvas.width = Math.round(w * ratio); canvas.height = Math.round(h * ratio); }
  }

  function lines(canvas, data, specs, opts) {
    /* specs: [[column, label, scale]]; draws them and writes the legend with each series' last value. */
    fit(canvas);
    var t = data.t || [];
    GC.drawLines(canvas, specs.map(function (s) { return ring(t, data[s[0]], s[2]); }),
      { min: opts.min, max: opts.max, axis: true, colors: COLORS, windowS: data.to - data.from });
    var legend = canvas.parentNode.querySelector(".chart-legend");
    if (!legend) { return; }
    legend.textContent = "";
    specs.forEach(function (s, n) {
      var values = data[s[0]] || [], last = null;
      for (var i = values.length - 1; i >= 0 && last === null; i--) { if (values[i] !== null) { last = values[i] * (s[2] || 1); } }
      var item = document.createElement("span");
      item.className = "legend-item";
      item.style.borderColor = COLORS[n % COLORS.length];
      item.textContent = s[1] + ": " + GC.fmt(last === null ? NaN : last) + (opts.unit || "");
      legend.appendChild(item);
    });
  }

  var GIB = 1 / 1024, MIN = 1 / 60;
  var CHARTS = {
    utilization: function (c, d) { lines(c, d, [["utilization_pct", "mean"], ["utilization_max_pct", "peak"]], { min: 0, max: 100, unit: " %" }); },
    memory: function (c, d) { lines(c, d, [["memory_used_mb", "used", GIB], ["memory_total_mb", "total", GIB]], { min: 0, unit: " GiB" }); },
    temperature: function (c, d) { lines(c, d, [["temperature_c", "hottest"]], { unit: " °C" }); },
    power: function (c, d) { lines(c, d, [["power_w", "power"]], { min: 0, unit: " W" }); },
    gpus: function (c, d) { lines(c, d, [["gpus_allocated", "allocated"], ["gpus_idle", "idle"], ["gpus_stale", "stale"], ["gpus_down", "down"]], { min: 0 }); },
    queue: function (c, d) { lines(c, d, [["queued", "queued"]], { min: 0 }); },
    waits: function (c, d) { lines(c, d, [["wait_max_s", "longest", MIN], ["wait_avg_s", "mean", MIN]], { min: 0, unit: " min" }); },
    team: function (c, d) { lines(c, d, [["allocated", "held"], ["guaranteed", "within quota"], ["borrowed", "borrowed"], ["quota", "quota"]], { min: 0 }); }
  };

  function merge(into, more, since, keepFrom) {
    /* Replace what was drawn from `since` on with the fresh buckets (GPU buckets close a little after the
       cluster's snapshot of the same time, so the last minute is read again), then drop those before the
       range's start. */
    var names = Object.keys(into).filter(function (k) { return Array.isArray(into[k]); });
    var cut = 0;
    while (cut < into.t.length && into.t[cut] < since) { cut++; }
    names.forEach(function (k) { into[k].splice(cut); });
    (more.t || []).forEach(function (t, i) {
      names.forEach(function (k) { into[k].push(k === "t" ? t : (more[k] ? more[k][i] : null)); });
    });
    var drop = 0;
    while (drop < into.t.length && into.t[drop] < keepFrom) { drop++; }
    if (drop) { names.forEach(function (k) { into[k].splice(0, drop); }); }
  }

  function History(section) {
    this.section = section;
    this.status = section.querySelector(".history-status");
    this.figures = Array.prototype.slice.call(section.querySelectorAll("figure.chart"));
    this.data = {};
    this.timer = null;
    var self = this;
    section.querySelectorAll("button[data-range]").forEach(function (b) {
      if (b.dataset.range !== "custom") { b.addEventListener("click", function () { self.show(b.dataset.range); }); }
    });
    section.querySelector("form.range-picker").addEventListener("submit", function (event) {
      event.preventDefault();
      self.show("custom");
    });
    window.addEventListener("resize", function () { self.drawAll(); });
    this.show("1h");
  }

  History.prototype.sources = function () {
    var base = this.section.dataset.history, seen = {};
    this.figures.forEach(function (f) { seen[f.dataset.src || base] = true; });
    return Object.keys(seen);
  };

  History.prototype.query = function (range) {
    if (range !== "custom") { return "range=" + range; }
    var form = this.section.querySelector("form.range-picker");
    var from = form.elements.from.value, to = form.elements.to.value;
    var q = "from=" + encodeURIComponent(from ? new Date(from).toISOString() : "");
    return to ? q + "&to=" + encodeURIComponent(new Date(to).toISOString()) : q;
  };

  History.prototype.fetch = function (src, query) {
    return fetch(src + "?" + query, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        return response.json().then(function (body) {
          if (!response.ok) {
            var field = Object.keys(body)[0];
            throw new Error(field + ": " + [].concat(body[field]).join(" "));
          }
          return body;
        });
      });
  };

  History.prototype.show = function (range) {
    var self = this;
    clearTimeout(this.timer);
    this.range = range;
    this.section.querySelectorAll("button[data-range]").forEach(function (b) {
      b.setAttribute("aria-pressed", b.dataset.range === range ? "true" : "false");
    });
    var query = this.query(range);
    this.status.textContent = "Loading…";
    Promise.all(this.sources().map(function (src) {
      return self.fetch(src, query).then(function (body) { self.data[src] = body; });
    })).then(function () {
      var any = self.sources().some(function (src) { return self.data[src].t.length; });
      var res = self.data[self.sources()[0]].resolution_s;
      self.status.textContent = (any ? "" : "No history recorded in this range yet. ") + res + "-second buckets" +
        (range in RANGES ? ", updating live." : ".");
      self.drawAll();
      if (range in RANGES) { self.timer = setTimeout(function () { self.live(); }, Math.max(res, 10) * 1000); }
    }, function (error) { self.status.textContent = "Could not load the history: " + error.message; });
  };

  History.prototype.live = function () {
    /* Append what was recorded since the last buckets drawn, at the same resolution. */
    var self = this, range = this.range;
    if (!(range in RANGES)) { return; }
    var now = Date.now() / 1000;
    Promise.all(this.sources().map(function (src) {
      var have = self.data[src], res = have.resolution_s;
      var from = have.t.length ? have.t[have.t.length - 1] - OVERLAP * res : now - RANGES[range];
      return self.fetch(src, "from=" + from + "&resolution=" + res).then(function (more) {
        merge(have, more, from, now - RANGES[range]);
      });
    })).then(function () { self.drawAll(); }, function () { /* the next tick retries */ }).then(function () {
      if (self.range === range) { self.timer = setTimeout(function () { self.live(); }, Math.max(self.data[self.sources()[0]].resolution_s, 10) * 1000); }
    });
  };

  History.prototype.drawAll = function () {
    var self = this, base = this.section.dataset.history;
    this.figures.forEach(function (f) {
      var data = self.data[f.dataset.src || base], draw = CHARTS[f.dataset.chart];
      if (data && draw) { draw(f.querySelector("canvas"), data); }
    });
  };

  document.querySelectorAll("section.history[data-history]").forEach(function (section) { new History(section); });
})();
