/* Usage report: stacked bars of used / idle / unknown GPU-hours per team. */
(function () {
  "use strict";
  var data = window.GC.jsonData("report-data");
  var canvas = document.getElementById("report-chart");
  if (!data || !canvas || !data.labels.length) { return; }
  var ctx = canvas.getContext("2d");
  var w = canvas.width, h = canvas.height, left = 40, bottom = 36;
  var series = [["used", "#2b7a0b"], ["idle", "#b35900"], ["unknown", "#8c959f"]];
  var totals = data.labels.map(function (_, i) { return data.used[i] + data.idle[i] + data.unknown[i]; });
  var max = Math.max.apply(null, totals.concat([1e-9]));
  var slot = (w - left) / data.labels.length, bar = Math.min(60, slot * 0.6);
  ctx.font = "12px system-ui, sans-serif";
  ctx.fillStyle = "#1b1f24";
  ctx.fillText(max.toFixed(1) + " h", 0, 12);
  data.labels.forEach(function (label, i) {
    var x = left + i * slot + (slot - bar) / 2, y = h - bottom;
    series.forEach(function (s) {
      var v = data[s[0]][i], bh = (h - bottom - 16) * v / max;
      ctx.fillStyle = s[1];
      ctx.fillRect(x, y - bh, bar, bh);
      y -= bh;
    });
    ctx.fillStyle = "#1b1f24";
    ctx.fillText(label, x, h - bottom + 14);
  });
  var lx = left;
  series.forEach(function (s) {
    ctx.fillStyle = s[1];
    ctx.fillRect(lx, h - 12, 10, 10);
    ctx.fillStyle = "#1b1f24";
    ctx.fillText(s[0], lx + 14, h - 3);
    lx += 80;
  });
})();
