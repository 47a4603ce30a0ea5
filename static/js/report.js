/* Usage report: stacked bars of used / idle / unknown GPU-hours per team (uPlot, through GC.drawStackedBars). */
(function () {
  "use strict";
  var GC = window.GC;
  var data = GC.jsonData("report-data");
  if (!data || !data.labels.length) { return; }
  GC.drawStackedBars(document.getElementById("report-chart"), data.labels, [
    { label: "used", values: data.used, color: "--chart-used" },
    { label: "idle", values: data.idle, color: "--chart-idle" },
    { label: "unknown", values: data.unknown, color: "--chart-unknown" },
  ], { unit: " h", categoryLabel: "team" });
})();
