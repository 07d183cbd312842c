// Vellum console: draws the charts (uPlot, served by the console) and refreshes the page's live
// block every data-refresh seconds while the page is visible, keeping keyboard focus in place.
(function () {
  "use strict";
  var plots = [];
  var COLORS = ["#1d4e89", "#b8461b", "#2a7d3f", "#6b3fa0"];

  function fmtTime(v) {
    var d = new Date(v * 1000);
    return d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }

  function drawCharts(root) {
    plots.forEach(function (p) { p.destroy(); });
    plots = [];
    if (typeof uPlot === "undefined") { return; }
    root.querySelectorAll(".chart[data-chart]").forEach(function (el) {
      var spec;
      try { spec = JSON.parse(el.getAttribute("data-chart")); } catch (e) { return; }
      var series = (spec.series || []).filter(function (s) { return s.values && s.values.length === spec.t.length; });
      if (!spec.t || spec.t.length < 2 || series.length === 0) {
        el.textContent = "Collecting samples: the chart appears after two scrapes.";
        el.classList.add("empty");
        return;
      }
      var width = Math.max(200, el.clientWidth || 300);
      var opts = {
        width: width, height: 140,
        legend: { show: true },
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: true } },
        axes: [{ values: function (u, vals) { return vals.map(fmtTime); }, size: 30 }, { size: 60 }],
        series: [{}].concat(series.map(function (s, i) {
          return { label: s.label, stroke: COLORS[i % COLORS.length], width: 2, points: { show: false } };
        }))
      };
      var data = [spec.t].concat(series.map(function (s) { return s.values; }));
      plots.push(new uPlot(opts, data, el));
    });
  }

  function setStatus(text) {
    var st = document.getElementById("refresh-status");
    if (st) { st.textContent = text; }
  }

  function refresh() {
    var live = document.getElementById("live");
    if (!live || document.hidden) { return; }
    if (live.contains(document.activeElement) && document.activeElement !== document.body) { return; }
    fetch(window.location.href, { headers: { "X-Console-Fragment": "1" }, cache: "no-store", credentials: "same-origin" })
      .then(function (resp) { return resp.text().then(function (body) { return { ok: resp.ok, status: resp.status, body: body }; }); })
      .then(function (r) {
        if (live.contains(document.activeElement) && document.activeElement !== document.body) { return; }
        live.innerHTML = r.body;
        drawCharts(live);
        var now = new Date();
        setStatus((r.ok ? "updated " : "refreshed with an error (HTTP " + r.status + ") ") + now.toLocaleTimeString());
      })
      .catch(function () { setStatus("the console does not answer; retrying"); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    drawCharts(document);
    var seconds = parseFloat(document.body.getAttribute("data-refresh") || "0");
    if (seconds > 0) {
      window.setInterval(refresh, seconds * 1000);
    }
    var timer = null;
    window.addEventListener("resize", function () {
      window.clearTimeout(timer);
      timer = window.setTimeout(function () { drawCharts(document); }, 200);
    });
  });
}());
