// Renderer of the IO-model widget (svg_figure kind "io_model"): HBM traffic per algorithm.
// data: flashlib.schedule.io_widget_data(...); values: {N, d, M, bytes, bandwidth (TB/s)}.
// Top: one bar per algorithm (modelled bytes; a tick where a counting-memory run agrees),
// its ratio to standard attention and the time the traffic alone takes at that bandwidth.
// Bottom: elements moved against the SRAM size M (log-log) for this N and d, M marked.
function draw(data, values, h) {
  var key = values.N + "-" + values.d + "-" + values.M;
  var row = data.rows[key];
  if (!row) throw new Error("no row for " + key);
  var floor = data.floor[values.N + "-" + values.d];
  var bpe = values.bytes, bw = values.bandwidth * 1e12;
  var orders = [["standard", "Algorithm 0 (standard)", "#D55E00"],
                ["v1", "Algorithm 1", "#0072B2"],
                ["v2", "FlashAttention-2 order", "#009E73"]];
  var W = 360, parts = [], y = 14;
  function text(x, yy, s, attrs) {
    parts.push(h.el("text", Object.assign({x: x, y: yy}, attrs || {}), h.esc(s)));
  }
  text(0, y, "N = " + values.N + ", d = " + values.d + ", M = " + h.fmt(values.M) +
       " elements", {"font-weight": "bold"});
  y += 15;
  text(0, y, "SRAM of " + h.bytes(values.M * bpe) + " at " + bpe + " bytes per element");
  y += 12;
  var standard = row.standard[2], big = standard;
  orders.forEach(function (o) { if (row[o[0]][2] !== null) big = Math.max(big, row[o[0]][2]); });
  var x0 = 0, barW = 300, alt = [];
  orders.forEach(function (o) {
    var r = row[o[0]], name = o[1];
    y += 16;
    text(0, y, name + (r[0] !== null ? "  (B_r = " + r[0] + ", B_c = " + r[1] + ")" : ""),
         {"font-weight": "bold"});
    y += 4;
    if (r[2] === null) {
      y += 14;
      text(8, y, "M cannot hold one step: even 1 x 1 blocks overflow");
      y += 6;
      alt.push(name + ": M cannot hold one step");
      return;
    }
    var w = Math.max(1, barW * r[2] / big);
    parts.push(h.el("rect", {x: x0, y: y, width: w, height: 12, fill: o[2],
                             "fill-opacity": 0.8}));
    var fx = x0 + barW * floor / big;  // the 4 N d floor on the bars' scale
    parts.push(h.el("line", {x1: fx, y1: y - 3, x2: fx, y2: y + 15, stroke: "currentColor",
                             "stroke-width": 1.5, "stroke-dasharray": "3 2"}));
    if (r[3] !== null) {
      parts.push(h.el("text", {x: x0 + w + 4, y: y + 11, "font-weight": "bold"},
                      r[3] === r[2] ? "\u2713" : "\u2717"));
    }
    y += 26;
    var bytes = r[2] * bpe, micro = bytes / bw * 1e6;
    var counted = r[3] === null ? "not run" : r[3] === r[2] ? "counted: equal" :
      "counted: " + h.fmt(r[3]);
    text(8, y, h.bytes(bytes) + ", " + h.fmt(r[2] / standard, 3) + "x standard, " +
         h.fmt(micro, 3) + " \u00b5s; " + counted);
    y += 4;
    alt.push(name + ": " + h.bytes(bytes) + ", " + h.fmt(r[2] / standard, 3) +
             " times standard attention, " + h.fmt(micro, 3) + " microseconds");
  });
  y += 18;
  text(0, y, "dashed: the 4 N d floor, " + h.bytes(floor * bpe) + "; \u2713: a counted run equal");
  // bottom panel: log-log elements against M
  y += 16;
  var px = 46, pw = 300, ph = 120, py = y + 8;
  var Ms = data.M_values, lo = Math.log(Ms[0]), hi = Math.log(Ms[Ms.length - 1]);
  var ymin = Math.log(floor) - 0.2, ymax = ymin;
  var curves = orders.map(function (o) {
    return Ms.map(function (M) {
      var v = data.rows[values.N + "-" + values.d + "-" + M][o[0]][2];
      if (v !== null) ymax = Math.max(ymax, Math.log(v));
      return v;
    });
  });
  ymax += 0.2;
  function X(M) { return px + pw * (Math.log(M) - lo) / (hi - lo); }
  function Y(v) { return py + ph - ph * (Math.log(v) - ymin) / (ymax - ymin); }
  parts.push(h.el("rect", {x: px, y: py, width: pw, height: ph, fill: "none",
                           stroke: "currentColor", "stroke-width": 0.8}));
  parts.push(h.el("line", {x1: px, y1: Y(floor), x2: px + pw, y2: Y(floor),
                           stroke: "currentColor", "stroke-dasharray": "3 3"}));
  curves.forEach(function (c, k) {
    var pts = [];
    c.forEach(function (v, i) { if (v !== null) pts.push(X(Ms[i]).toFixed(1) + "," + Y(v).toFixed(1)); });
    if (pts.length) parts.push(h.el("polyline", {points: pts.join(" "), fill: "none",
      stroke: orders[k][2], "stroke-width": 2}));
  });
  parts.push(h.el("line", {x1: X(values.M), y1: py, x2: X(values.M), y2: py + ph,
                           stroke: "#CC79A7", "stroke-width": 2}));
  text(px - 4, py + 12, "more", {"text-anchor": "end"});
  text(px - 4, py + ph, "less", {"text-anchor": "end"});
  text(px, py + ph + 14, h.fmt(Ms[0]));
  text(px + pw, py + ph + 14, h.fmt(Ms[Ms.length - 1]), {"text-anchor": "end"});
  text(px + pw / 2, py + ph + 14, "SRAM size M (log)", {"text-anchor": "middle"});
  y = py + ph + 32;
  text(0, y, "elements moved (log) against M; pink: this M");
  y += 8;
  var svg = h.el("svg", {xmlns: "http://www.w3.org/2000/svg", viewBox: "0 0 " + W + " " + y,
    width: W, height: y, "font-size": 12, fill: "currentColor", "font-family": "sans-serif"},
    parts.join(""));
  var say = "N = " + values.N + ", d = " + values.d + ", M = " + values.M + " elements, " +
    bpe + " bytes per element, " + values.bandwidth + " TB/s. " + alt.join("; ") + ".";
  return {svg: svg, alt: say};
}
