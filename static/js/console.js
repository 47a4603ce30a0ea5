/* GPU console: shared helpers (no dependencies). Exposed as window.GC. */
(function () {
  "use strict";

  /* A fixed-size ring buffer of [t, v] pairs: memory stays constant however long the page is open. */
  function Ring(capacity) {
    this.capacity = capacity;
    this.t = new Float64Array(capacity);
    this.v = new Float64Array(capacity);
    this.start = 0;
    this.length = 0;
  }
  Ring.prototype.push = function (t, v) {
    var i = (this.start + this.length) % this.capacity;
    if (this.length === this.capacity) {
      this.start = (this.start + 1) % this.capacity;
    } else {
      this.length += 1;
    }
    this.t[i] = t;
    this.v[i] = (v === null || v === undefined) ? NaN : v;
  };
  Ring.prototype.last = function () {
    if (!this.length) { return null; }
    var i = (this.start + this.length - 1) % this.capacity;
    return { t: this.t[i], v: this.v[i] };
  };
  Ring.prototype.forEach = function (fn) {
    for (var k = 0; k < this.length; k++) {
      var i = (this.start + k) % this.capacity;
      fn(this.t[i], this.v[i], k);
    }
  };

  function cssVar(name, fallback) {
    var value = getComputedStyle(document.documentElement).getPropertyValue(name);
    return (value && value.trim()) || fallback;
  }

  /* Charts are uPlot (static/vendor/uplot): time axes, hover values in the legend, sharp on high-density screens.
     Colours come from CSS variables, so a chart follows the page's light or dark scheme. */
  function palette() {
    return {
      series: [1, 2, 3, 4, 5].map(function (n, i) {
        return cssVar("--chart-" + n, ["#0b5cad", "#b35900", "#2b7a0b", "#8a3ffc", "#b42318"][i]);
      }),
      axis: cssVar("--muted", "#57606a"),
      grid: cssVar("--chart-grid", "rgba(0,0,0,.08)"),
    };
  }

  var ZONE = (function () {
    try { return Intl.DateTimeFormat().resolvedOptions().timeZone || "local time"; } catch (e) { return "local time"; }
  })();

  /* The rings as uPlot's columns: one sorted time axis, one column per ring (null where a ring has no sample). */
  function columns(rings, tFrom) {
    if (rings.length === 1) { /* one ring (every sparkline): its own order, when it is in time order */
      var ts = [], vs = [], sorted = true;
      rings[0].forEach(function (t, v) {
        if (t < tFrom) { return; }
        if (ts.length && t <= ts[ts.length - 1]) { sorted = false; }
        ts.push(t); vs.push(isNaN(v) ? null : v);
      });
      if (sorted) { return [ts, vs]; }
    }
    var byT = {}, times = [];
    rings.forEach(function (r, n) {
      r.forEach(function (t, v) {
        if (t < tFrom) { return; }
        var row = byT[t];
        if (!row) { row = byT[t] = []; times.push(t); }
        row[n] = isNaN(v) ? null : v;
      });
    });
    times.sort(function (a, b) { return a - b; });
    var data = [times];
    rings.forEach(function (_, n) {
      data.push(times.map(function (t) { var v = byT[t][n]; return v === undefined ? null : v; }));
    });
    return data;
  }

  function lastTime(rings) {
    var tMax = -Infinity;
    rings.forEach(function (r) { r.forEach(function (t) { if (t > tMax) { tMax = t; } }); });
    return tMax;
  }

  function two(n) { return n < 10 ? "0" + n : String(n); }

  /* Time ticks in 24-hour local time: seconds when ticks are under a minute apart, the date when the span is over a day. */
  function timeTicks(u, splits, axisIdx, space, incr) {
    var long = u.scales.x.max - u.scales.x.min > 86400;
    return splits.map(function (t) {
      var d = new Date(t * 1000);
      var text = two(d.getHours()) + ":" + two(d.getMinutes()) + (incr < 60 ? ":" + two(d.getSeconds()) : "");
      return long ? d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate()) + " " + text : text;
    });
  }

  function tick(v) { return v === 0 ? "0" : fmt(v); }

  /* Every time a page shows, one way (the template filter `when` in apps/dashboard/templatetags/console.py):
     24-hour, in the browser's time zone, the zone said: "2026-12-03 11:30:05 UTC". `at`: a Date, epoch ms, or an ISO
     string; precision "seconds" (default) or "minutes". */
  var ZONE_SHORT = (function () {
    try {
      var parts = new Intl.DateTimeFormat("en-US", { timeZoneName: "short" }).formatToParts(new Date());
      for (var i = 0; i < parts.length; i++) { if (parts[i].type === "timeZoneName") { return parts[i].value; } }
    } catch (e) { /* an old browser: the offset below */ }
    return null;
  })();
  function zoneName(d) {
    if (ZONE_SHORT) { return ZONE_SHORT; }
    var off = -d.getTimezoneOffset(), a = Math.abs(off);
    return off === 0 ? "UTC" : "UTC" + (off > 0 ? "+" : "-") + two(Math.floor(a / 60)) + (a % 60 ? ":" + two(a % 60) : "");
  }
  function when(at, precision) {
    if (at === null || at === undefined || at === "") { return "—"; }
    var d = at instanceof Date ? at : new Date(at);
    if (isNaN(d.getTime())) { return String(at); }
    var text = d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate()) + " " + two(d.getHours()) + ":"
      + two(d.getMinutes()) + (precision === "minutes" ? "" : ":" + two(d.getSeconds()));
    return text + " " + zoneName(d);
  }
  /* The server writes times in its own zone; the page shows them in the browser's, as its script writes new ones. */
  function localizeTimes(root) {
    var els = (root || document).querySelectorAll("time[data-when]");
    for (var i = 0; i < els.length; i++) {
      var el = els[i], text = when(el.getAttribute("datetime"), el.getAttribute("data-when"));
      if (el.textContent !== text) { el.textContent = text; }
    }
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { localizeTimes(); });
  } else {
    localizeTimes();
  }

  /* A value axis as wide as its longest label. */
  function axisSize(u, values) {
    var longest = 0;
    (values || []).forEach(function (v) { longest = Math.max(longest, String(v).length); });
    return Math.max(32, Math.ceil(longest * 7) + 20);
  }

  /* One sample draws a point (a line needs two); a series with few samples shows its points. */
  function fewPoints(u, si) {
    var d = u.data[si], n = 0;
    for (var i = 0; i < d.length; i++) { if (d[i] !== null && ++n > 1) { return false; } }
    return true;
  }

  function chartWidth(box, fallback) {
    return Math.max(60, box.clientWidth || (box.parentNode && box.parentNode.clientWidth) || fallback || 300);
  }

  var charts = []; /* every chart on the page, rebuilt when the colour scheme changes */

  function build(state) {
    var opts = state.opts, colors = opts.colors || palette().series, pal = palette();
    var spark = !opts.axis;
    var labels = state.labels;
    var unit = opts.unit || "";
    var series = [opts.xStep ? { label: "Step", value: function (u, x) {
      return x === null || x === undefined ? "—" : String(Math.round(x));
    } } : { label: "Time (" + ZONE + ")", value: function (u, t) {
      if (t === null || t === undefined) { return "—"; }
      var d = new Date(t * 1000);
      return d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate()) + " " + two(d.getHours()) + ":"
        + two(d.getMinutes()) + ":" + two(d.getSeconds());
    } }];
    labels.forEach(function (label, n) {
      series.push({
        label: label, stroke: colors[n % colors.length], width: 1.5, spanGaps: true,
        points: { show: fewPoints, size: 5, fill: colors[n % colors.length] },
        value: function (u, v) { return v === null || v === undefined ? "—" : fmt(v) + unit; },
      });
    });
    var range = function (u, lo, hi, fixedLo, fixedHi) {
      lo = fixedLo !== undefined ? fixedLo : lo;
      hi = fixedHi !== undefined ? fixedHi : hi;
      if (lo === null || hi === null || !isFinite(lo) || !isFinite(hi)) { lo = fixedLo !== undefined ? fixedLo : 0; hi = lo + 1; }
      if (hi <= lo) { var pad = Math.abs(lo) * 0.1 || 1; return [fixedLo !== undefined ? lo : lo - pad, hi + pad]; }
      if (fixedHi === undefined) { hi += (hi - lo) * 0.05; }
      if (fixedLo === undefined) { lo -= (hi - lo) * 0.05; }
      return [lo, hi];
    };
    var axisFont = "11px system-ui, sans-serif";
    var config = {
      width: chartWidth(state.box, state.width),
      height: state.height,
      pxAlign: 0,
      legend: { show: !spark, live: true },
      cursor: spark ? { y: false, points: { show: false } } : { y: false },
      scales: {
        /* from the data itself: uPlot widens a one-sample time range to years */
        x: opts.xStep ? { time: false, range: function (u, lo, hi) { return range(u, lo, hi); } } : { time: true, range: function (u) {
          var t = u.data[0], lo = t.length ? t[0] : null, hi = t.length ? t[t.length - 1] : null;
          if (hi === null) { var now = Date.now() / 1000; return [now - (opts.windowS || 60), now]; }
          if (opts.windowS) { return [hi - opts.windowS, hi]; }
          return hi - lo < 1 ? [lo - 30, hi + 30] : [lo, hi];
        } },
        y: { range: function (u, lo, hi) { return range(u, lo, hi, opts.min, opts.max); } },
      },
      axes: spark ? [{ show: false }, { show: false }] : [
        { stroke: pal.axis, font: axisFont, grid: { stroke: pal.grid, width: 1 }, ticks: { stroke: pal.grid },
          values: opts.xStep ? function (u, splits) { return splits.map(function (v) { return String(Math.round(v)); }); }
            : timeTicks },
        { stroke: pal.axis, font: axisFont, size: axisSize, grid: { stroke: pal.grid, width: 1 }, ticks: { stroke: pal.grid },
          values: function (u, splits) { return splits.map(tick); } },
      ],
      series: series,
      hooks: spark ? { setCursor: [function (u) {
        /* a sparkline has no legend: its hover value is the tooltip */
        var i = u.cursor.idx;
        u.root.title = i === null || i === undefined ? ""
          : labels[0] + " " + series[1].value(u, u.data[1][i]) + " at " + series[0].value(u, u.data[0][i]);
      }] } : {},
    };
    state.chart = new window.uPlot(config, state.data, state.box);
    state.chart.root.setAttribute("role", "img");
    if (state.ariaLabel) { state.chart.root.setAttribute("aria-label", state.ariaLabel); }
  }

  /* Draw one or more rings as lines: a uPlot chart in place of `target` (a canvas is kept, hidden, as the anchor and
     gives the size). opts: {min, max, windowS, colors, labels, axis, unit, xStep (x is a step, not a time)}. axis false: a sparkline (no axes, no
     legend, hover value as the tooltip). */
  function drawLines(target, rings, opts) {
    if (!target) { return; }
    opts = opts || {};
    var state = target._gcChart;
    if (!state) {
      if (!window.uPlot) { return; }
      var box = target;
      var width = parseInt(target.getAttribute("width"), 10) || 0, height = parseInt(target.getAttribute("height"), 10) || 0;
      if (target.tagName === "CANVAS") {
        if (!opts.axis) { height = target.clientHeight || 28; width = 0; }
        box = document.createElement("div");
        target.hidden = true;
        target.parentNode.insertBefore(box, target.nextSibling);
      }
      box.className = (box.className ? box.className + " " : "") + (opts.axis ? "chart" : "chart spark-chart");
      var empty = null;
      if (opts.axis) { /* a sparkline's cell says "no data" itself */
        empty = document.createElement("p");
        empty.className = "chart-empty";
        empty.textContent = "no data yet";
        empty.hidden = true;
        box.appendChild(empty);
      }
      var caption = target.closest && target.closest("figure") && target.closest("figure").querySelector("figcaption");
      state = target._gcChart = { box: box, empty: empty, width: width, height: height || (opts.axis ? 140 : 28),
        ariaLabel: target.getAttribute("aria-label"), defaultLabel: caption ? caption.textContent : "value" };
      charts.push(state);
      if (window.ResizeObserver) {
        var lastW = 0;
        new ResizeObserver(function () {
          var w = chartWidth(state.box, state.width);
          if (state.chart && w !== lastW) { lastW = w; state.chart.setSize({ width: w, height: state.height }); }
        }).observe(box.parentNode || box);
      }
    }
    var labels = rings.map(function (_, n) {
      return (opts.labels && opts.labels[n]) || (rings.length > 1 ? "series " + (n + 1) : state.defaultLabel);
    });
    var tMax = lastTime(rings);
    var data = columns(rings, opts.windowS && tMax > -Infinity ? tMax - opts.windowS : -Infinity);
    state.opts = opts;
    state.data = data;
    if (state.empty) { state.empty.hidden = data[0].length > 0; }
    if (state.chart && state.labels && state.labels.join("\n") === labels.join("\n")) {
      state.chart.setData(data);
      return;
    }
    if (state.chart) { state.chart.destroy(); }
    state.labels = labels;
    build(state);
  }

  /* Stacked bars by category (the usage report): series drawn as running totals, the legend shows each value. */
  function drawStackedBars(box, categories, stacks, opts) {
    if (!box || !window.uPlot || !categories.length) { return; }
    opts = opts || {};
    var state = box._gcChart || (box._gcChart = { box: box, bars: true, width: parseInt(box.dataset.width, 10) || 900,
      height: parseInt(box.dataset.height, 10) || 220 });
    if (charts.indexOf(state) < 0) { charts.push(state); }
    state.rebuild = function () { drawStackedBars(box, categories, stacks, opts); };
    if (state.chart) { state.chart.destroy(); }
    var pal = palette(), colors = opts.colors || pal.series;
    var xs = categories.map(function (_, i) { return i; });
    var running = categories.map(function () { return 0; }), tops = [];
    stacks.forEach(function (s) {
      running = running.map(function (r, i) { return r + (s.values[i] || 0); });
      tops.push(running.slice());
    });
    /* the tallest stack is drawn first, so each shorter one covers its lower part */
    var order = stacks.map(function (_, n) { return n; }).reverse();
    var unit = opts.unit || "";
    var bars = window.uPlot.paths.bars({ size: [0.6, 60] });
    var series = [{ label: opts.categoryLabel || "category", value: function (u, i) { return i === null ? "—" : categories[i]; } }];
    order.forEach(function (n) {
      var color = stacks[n].color ? (stacks[n].color.indexOf("--") === 0 ? cssVar(stacks[n].color, "#2b7a0b") : stacks[n].color)
        : colors[n % colors.length];
      series.push({ label: stacks[n].label, fill: color, stroke: color, width: 0, paths: bars, points: { show: false },
        value: function (u, v, si, i) { return i === null || i === undefined ? "—" : fmt(stacks[n].values[i] || 0) + unit; } });
    });
    var axisFont = "12px system-ui, sans-serif";
    state.chart = new window.uPlot({
      width: chartWidth(box, state.width), height: state.height,
      legend: { live: true },
      cursor: { y: false, points: { show: false } },
      scales: { x: { time: false, range: function () { return [-0.5, categories.length - 0.5]; } },
        y: { range: function (u, lo, hi) { return [0, hi > 0 ? hi * 1.05 : 1]; } } },
      axes: [
        { stroke: pal.axis, font: axisFont, grid: { show: false }, ticks: { stroke: pal.grid },
          splits: function () { return xs; }, values: function (u, splits) { return splits.map(function (i) { return categories[i] || ""; }); } },
        { stroke: pal.axis, font: axisFont, size: axisSize, grid: { stroke: pal.grid, width: 1 }, ticks: { stroke: pal.grid },
          values: function (u, splits) { return splits.map(function (v) { return tick(v) + unit; }); } },
      ],
      series: series,
    }, [xs].concat(order.map(function (n) { return tops[n]; })), box);
    state.chart.root.setAttribute("role", "img");
    if (box.dataset.label) { state.chart.root.setAttribute("aria-label", box.dataset.label); }
  }

  /* A change of the browser's colour scheme redraws every chart in the new colours. */
  if (window.matchMedia) {
    var scheme = window.matchMedia("(prefers-color-scheme: dark)");
    var redraw = function () {
      charts.forEach(function (state) {
        if (state.rebuild) { state.rebuild(); return; }
        if (!state.chart) { return; }
        state.chart.destroy();
        build(state);
      });
    };
    if (scheme.addEventListener) { scheme.addEventListener("change", redraw); } else if (scheme.addListener) { scheme.addListener(redraw); }
  }

  function fmt(v) {
    if (v === null || v === undefined || isNaN(v)) { return "no data"; }
    var a = Math.abs(v);
    return a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : a >= 1 ? v.toFixed(2) : v.toPrecision(2);
  }

  function reading(v, unit) {
    if (v === null || v === undefined) { return "no data"; }
    var a = Math.abs(v);
    return (a >= 10 || v === Math.round(v) ? v.toFixed(0) : v.toFixed(1)) + (unit || "");
  }

  /* Websocket with reconnection (exponential backoff, capped), and a status line for people. */
  function connect(path, onMessage, statusEl) {
    var delay = 1000, socket = null, stopped = false, timer = null;
    function status(state, text) {
      if (!statusEl) { return; }
      statusEl.dataset.state = state;
      statusEl.textContent = text;
    }
    function open() {
      if (!("WebSocket" in window)) { status("off", "Live updates unavailable in this browser; showing data as of page load."); return; }
      var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path;
      try { socket = new WebSocket(url); } catch (e) { retry(); return; }
      socket.onopen = function () { delay = 1000; status("live", "Live"); };
      socket.onmessage = function (event) {
        var msg;
        try { msg = JSON.parse(event.data); } catch (e) { return; }
        if (msg.type === "resync") {
          toast("Live updates fell behind; reload the page for the latest state.", "warning");
        }
        try { onMessage(msg); } catch (e) { if (window.console) { console.error(e); } }
      };
      socket.onclose = function (event) {
        socket = null;
        if (stopped) { return; }
        var code = event && event.code;
        if (code === 4401 || code === 4403 || code === 4404) {
          /* not logged in, no access, no such job: retrying would not help */
          status("off", code === 4401 ? "Live updates stopped: your session has ended; log in again."
            : "Live updates are not available to you here; showing data as of page load.");
          return;
        }
        retry();
      };
      socket.onerror = function () { /* onclose follows */ };
    }
    function retry() {
      status("off", "Live updates unavailable; showing data as of page load. Retrying in " + Math.round(delay / 1000) + " s.");
      timer = setTimeout(open, delay);
      delay = Math.min(delay * 2, 30000) * (0.8 + Math.random() * 0.4);
    }
    open();
    return { close: function () { stopped = true; clearTimeout(timer); if (socket) { socket.close(); } } };
  }

  function toast(text, level) {
    var box = document.getElementById("toasts");
    if (!box) { return; }
    var el = document.createElement("div");
    el.className = "toast toast-" + (level || "info");
    el.textContent = text;
    box.appendChild(el);
    while (box.children.length > 5) { box.removeChild(box.firstChild); }
    setTimeout(function () { if (el.parentNode) { el.parentNode.removeChild(el); } }, 8000);
  }

  function alertToast(alert) {
    if (!alert || alert.state !== "firing") { return; }
    var where = [alert.host, alert.gpu !== null && alert.gpu !== undefined ? "GPU " + alert.gpu : null,
      alert.job ? "job " + alert.job : null, alert.team].filter(Boolean).join(" · ");
    toast("Alert (" + alert.severity + "): " + alert.message + (where ? " — " + where : ""),
      alert.severity === "critical" ? "critical" : "warning");
  }

  function jsonData(id) {
    var el = document.getElementById(id);
    if (!el) { return null; }
    try { return JSON.parse(el.textContent); } catch (e) { return null; }
  }

  /* Destructive actions ask first (apps/dashboard/confirm.py): yes adds confirm=yes to the post; without
     JavaScript, the server's confirm page asks instead. */
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form || !form.getAttribute || !form.getAttribute("data-confirm-text")) { return; }
    if (!window.confirm(form.getAttribute("data-confirm-text"))) { event.preventDefault(); return; }
    var field = form.querySelector('input[name="confirm"]');
    if (!field) {
      field = document.createElement("input");
      field.type = "hidden";
      field.name = "confirm";
      form.appendChild(field);
    }
    field.value = "yes";
  });

  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) { return; }
    var input = document.querySelector(button.getAttribute("data-copy"));
    if (!input) { return; }
    input.select();
    var done = function () { button.textContent = "Copied"; };
    var copied = false;
    try { copied = document.execCommand("copy"); } catch (e) { copied = false; }
    if (copied) { done(); return; }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(input.value).then(done, function () { button.textContent = "Select and copy by hand"; });
    } else {
      button.textContent = "Select and copy by hand";
    }
  });

  window.GC = { Ring: Ring, drawLines: drawLines, drawStackedBars: drawStackedBars, connect: connect, toast: toast, alertToast: alertToast,
    jsonData: jsonData, reading: reading, fmt: fmt, when: when, localizeTimes: localizeTimes };
})();
