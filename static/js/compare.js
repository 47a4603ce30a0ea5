/* Compare page: one metric of several runs on one chart, one line per run (GC.MetricChart). */
(function () {
  "use strict";
  var GC = window.GC;
  var data = GC.jsonData("compare-data");
  if (!data) { return; }
  var chart = new GC.MetricChart(document.getElementById("compare-charts"), data.metric,
    GC.MetricChart.label(data.metric), { maxPoints: data.max_points, legend: true });
  data.runs.forEach(function (run) {
    chart.append(run.label, run.series || { steps: [], times: [], values: [] });
  });
  chart.draw();
})();
