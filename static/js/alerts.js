/* Alerts page: a toast for each new alert from /ws/cluster/. */
(function () {
  "use strict";
  var GC = window.GC;
  var seen = {};
  GC.connect("/ws/cluster/", function (msg) {
    if (msg.type !== "alert" || !msg.alert) { return; }
    var key = msg.alert.id + ":" + msg.alert.state;
    if (seen[key]) { return; }
    seen[key] = true;
    GC.alertToast(msg.alert);
    if (msg.alert.state === "firing") {
      var status = document.getElementById("live-status");
      if (status) { status.textContent = "New alerts: reload to see them in the table."; }
    }
  }, document.getElementById("live-status"));
})();
