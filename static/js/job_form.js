/* Job submission form: show the chosen preset's and workload's description, toggle builtin / command. */
(function () {
  "use strict";
  var GC = window.GC;
  var presets = {}, workloads = {};
  (GC.jsonData("presets") || []).forEach(function (p) { presets[p.name] = p; });
  (GC.jsonData("workloads") || []).forEach(function (w) { workloads[w.name] = w; });
  var form = document.getElementById("job-form");
  if (!form) { return; }
  var preset = form.querySelector("#id_preset"), kind = form.querySelector("#id_kind");
  var builtin = form.querySelector("#id_builtin");

  function showPreset() {
    var name = preset.value || (kind.value === "inference" ? "infer-fp32" : "baseline-fp32");
    var p = presets[name];
    document.getElementById("preset-description").textContent = p ? name + ": " + p.description : "";
  }
  function showWorkload() {
    var w = workloads[builtin.value];
    document.getElementById("workload-description").textContent = w ? w.description : "";
    var list = document.getElementById("workload-params");
    list.textContent = "";
    if (!w) { return; }
    Object.keys(w.params).forEach(function (name) {
      var p = w.params[name], li = document.createElement("li");
      li.textContent = name + " (" + p.type + ", default " + JSON.stringify(p["default"]) + "): " + p.help;
      list.appendChild(li);
    });
  }
  function showMode() {
    var checked = form.querySelector('input[name="workload_mode"]:checked');
    var mode = checked ? checked.value : "builtin";
    form.querySelectorAll("[data-mode]").forEach(function (el) { el.hidden = el.dataset.mode !== mode; });
  }
  preset.addEventListener("change", showPreset);
  kind.addEventListener("change", showPreset);
  builtin.addEventListener("change", showWorkload);
  form.querySelectorAll('input[name="workload_mode"]').forEach(function (r) { r.addEventListener("change", showMode); });
  showPreset(); showWorkload(); showMode();
})();
