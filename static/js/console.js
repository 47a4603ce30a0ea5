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

  /* Draw one or more rings as lines on a canvas. opts: {min, max, windowS, colors, labels, axis} */
  function drawLines(canvas, rings, opts) {
    opts = opts || {};
    var ctx = canvas.getContext("2d");
    if (!ctx) { return; }
    var w = canvas.width, h = canvas.height, pad = opts.axis ? 28 : 1;
    ctx.clearRect(0, 0, w, h);
    var tMax = -Infinity, tMin = Infinity, vMax = -Infinity, vMin = Infinity;
    rings.forEach(function (r) {
      r.forEach(function (t, v) {
        if (t > tMax) { tMax = t; }
        if (t < tMin) { tMin = t; }
        if (!isNaN(v)) { if (v > vMax) { vMax = v; } if (v < vMin) { vMin = v; } }
      });
    });
    if (tMax === -Infinity) {
      if (opts.axis) {
        ctx.fillStyle = cssVar("--muted", "#57606a");
        ctx.font = "12px system-ui, sans-serif";
        ctx.fillText("no data yet", 8, h / 2);
      }
      return;
    }
    if (opts.windowS) { tMin = Math.max(tMin, tMax - opts.windowS); if (tMax - tMin < opts.windowS) { tMin = tMax - opts.windowS; } }
    var lo = opts.min !== undefined ? opts.min : vMin, hi = opts.max !== undefined ? opts.max : vMax;
    if (!isFinite(lo) || !isFinite(hi)) { lo = 0; hi = 1; }
    if (hi === lo) { hi = lo + 1; }
    var x = function (t) { return pad + (w - pad - 2) * (tMax === tMin ? 1 : (t - tMin) / (tMax - tMin)); };
    var y = function (v) { return h - 2 - (h - 4) * (v - lo) / (hi - lo); };
    if (opts.axis) {
      ctx.fillStyle = cssVar("--muted", "#57606a");
      ctx.font = "11px system-ui, sans-serif";
      ctx.fillText(fmt(hi), 0, 10);
      ctx.fillText(fmt(lo), 0, h - 4);
      ctx.strokeStyle = cssVar("--line", "#d0d7de");
      ctx.beginPath(); ctx.moveTo(pad, 0); ctx.lineTo(pad, h); ctx.stroke();
    }
    var colors = opts.colors || [cssVar("--accent", "#0b5cad"), "#b35900", "#2b7a0b", "#8a3ffc", "#b42318"];
    rings.forEach(function (r, n) {
      ctx.strokeStyle = colors[n % colors.length];
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      var pen = false;
      r.forEach(function (t, v) {
        if (t < tMin || isNaN(v)) { pen = false; return; }
        if (pen) { ctx.lineTo(x(t), y(v)); } else { ctx.moveTo(x(t), y(v)); pen = true; }
      });
      ctx.stroke();
    });
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

  window.GC = { Ring: Ring, drawLines: drawLines, connect: connect, toast: toast, alertToast: alertToast,
    jsonData: jsonData, reading: reading, fmt: fmt };
})();
