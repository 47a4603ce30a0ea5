/* Metric charts of jobs (the job page, the compare page): one chart per metric, one line per run.
   Data comes as the API's columns ({steps, times, values}); the x axis is the step (the time where a point has
   none). Drawing is GC.drawLines (uPlot) with a step axis. Exposed as GC.MetricChart. */
(function () {
  "use strict";
  var GC = window.GC;
  var LIVE_POINTS = 3600;

  /* A chart in `box`: a figure with a caption, a canvas and a legend. figure.dataset.points counts the points held. */
  function MetricChart(box, name, label, opts) {
    this.name = name;
    this.opts = opts || {};
    this.lines = []; /* [{label, ring, lastStep}] */
    var fig = document.createElement("figure");
    fig.className = "metric-chart";
    fig.dataset.metric = name;
    fig.dataset.points = "0";
    var cap = document.createElement("figcaption");
    cap.textContent = label;
    var canvas = document.createElement("canvas");
    canvas.width = 460; canvas.height = 140;
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", label + " by step");
    var legend = document.createElement("p");
    legend.className = "legend";
    fig.appendChild(cap); fig.appendChild(canvas); fig.appendChild(legend);
    box.appendChild(fig);
    this.fig = fig; this.canvas = canvas; this.legend = legend;
  }
  MetricChart.prototype.line = function (label) {
    for (var i = 0; i < this.lines.length; i++) { if (this.lines[i].label === label) { return this.lines[i]; } }
    var line = { label: label, ring: new GC.Ring((this.opts.maxPoints || 2000) + LIVE_POINTS), lastStep: null };
    this.lines.push(line);
    return line;
  };
  /* Append a series' columns to the line `label` (points at or before its last step are skipped: already held). */
  MetricChart.prototype.append = function (label, columns) {
    var line = this.line(label);
    var n = columns.values.length;
    for (var i = 0; i < n; i++) {
      var step = columns.steps[i];
      if (step !== null && line.lastStep !== null && step <= line.lastStep) { continue; }
      line.ring.push(step !== null ? step : columns.times[i], columns.values[i]);
      if (step !== null) { line.lastStep = step; }
    }
    var total = 0;
    this.lines.forEach(function (l) { total += l.ring.length; });
    this.fig.dataset.points = String(total);
  };
  MetricChart.prototype.draw = function () {
    var colors = [getComputedStyle(document.documentElement).getPropertyValue("--accent").trim() || "#0b5cad",
      "#b35900", "#2b7a0b", "#8a3ffc", "#b42318", "#0e7490", "#a21caf", "#4d7c0f"];
    GC.drawLines(this.canvas, this.lines.map(function (l) { return l.ring; }),
      { axis: true, min: this.opts.min, colors: colors, xStep: true,
        labels: this.lines.map(function (l) { return l.label; }) });
    if (this.lines.length > 1 || this.opts.legend) {
      var legend = this.legend;
      legend.textContent = "";
      this.lines.forEach(function (l, i) {
        var item = document.createElement("span");
        item.className = "legend-item";
        item.style.borderColor = colors[i % colors.length];
        item.textContent = l.label;
        legend.appendChild(item);
      });
    }
  };

  var LABELS = { loss: "Loss", steps_per_s: "Steps per second", samples_per_s: "Samples per second" };
  MetricChart.label = function (name) { return LABELS[name] || name; };
  /* The built-in series first (loss, steps/s, samples/s), then the job's own metrics by name. */
  MetricChart.order = function (names) {
    var builtin = ["loss", "steps_per_s", "samples_per_s"];
    return names.slice().sort(function (a, b) {
      var ia = builtin.indexOf(a), ib = builtin.indexOf(b);
      if (ia >= 0 || ib >= 0) { return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib); }
      return a < b ? -1 : a > b ? 1 : 0;
    });
  };
  GC.MetricChart = MetricChart;
})();
