// Injected by test_report.sh into a copy of a report: measures every chart as laid out (the SVG's
// size on the page) and its marks (lines, bars, areas with a non-empty bounding box), and writes
// the list as JSON into <pre id="report-check"> for Chromium's --dump-dom.
(function () {
  const out = [];
  for (const fig of document.querySelectorAll("figure[data-chart]")) {
    const svg = fig.querySelector("svg.chart");
    const box = svg ? svg.getBoundingClientRect() : { width: 0, height: 0 };
    let marks = 0, area = 0;
    for (const el of svg ? svg.querySelectorAll("polyline, rect, polygon") : []) {
      const b = el.getBBox();
      if (b.width > 0 || b.height > 0) marks++;
      area += b.width * Math.max(b.height, 1);
    }
    out.push({ chart: fig.dataset.chart, empty: fig.dataset.empty === "1", w: box.width, h: box.height, marks: marks, area: area });
  }
  const pre = document.createElement("pre");
  pre.id = "report-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
