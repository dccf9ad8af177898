// Renderer of the IO-model widget (svg_figure kind "io_model"): why the traffic falls with M.
// data: flashlib.book.chapters.io_model.io_widget_data(...); values: {N, d, M} (M in elements).
// 1. What one step of the FlashAttention-2 order holds in an SRAM of M elements (sram).
// 2. The N query rows cut into T_r blocks of B_r rows: each block is one pass over K and V.
// 3. One bar per algorithm (passes): grey, what is moved once; coloured, what is moved again
//    on every pass, one segment per pass (standard: S and P); a tick where a counted run agrees.
// 4. Elements moved against M (log-log) for this N and d, this M marked.
function draw(data, values, h) {
  var key = values.N + "-" + values.d + "-" + values.M;
  var row = data.rows[key], passes = data.passes[key], sram = data.sram[key];
  if (!row) throw new Error("no row for " + key);
  var N = values.N, d = values.d, M = values.M;
  var floor = data.floor[N + "-" + d];
  var orders = [["standard", "Algorithm 0 (standard)", "#D55E00"],
                ["v1", "Algorithm 1", "#0072B2"],
                ["v2", "FlashAttention-2 order", "#009E73"]];
  var W = 360, barW = 300, parts = [], alt = [], y = 14;
  function text(x, yy, s, attrs) {
    parts.push(h.el("text", Object.assign({x: x, y: yy}, attrs || {}), h.esc(s)));
  }
  function rect(x, yy, w, ht, fill, extra) {
    parts.push(h.el("rect", Object.assign({x: x, y: yy, width: Math.max(0, w), height: ht,
                                           fill: fill}, extra || {})));
  }
  text(0, y, "N = " + N + ", d = " + d + ", M = " + h.fmt(M) + " elements",
       {"font-weight": "bold"});
  // 1. the SRAM
  y += 20;
  text(0, y, "1. One step of the FA-2 order in SRAM (M = full bar)", {"font-weight": "bold"});
  y += 6;
  var v2 = row.v2;
  if (sram === null) {
    y += 14;
    text(8, y, "M cannot hold one step: even 1 x 1 blocks overflow");
    alt.push("M cannot hold one step of the tiled orders");
  } else {
    var pieces = [["Q_i", "#56B4E9"], ["O_i", "#009E73"], ["K_j", "#E69F00"],
                  ["V_j", "#F0E442"], ["S_ij", "#CC79A7"]];
    var x = 0, used = 0;
    Object.keys(sram).forEach(function (k) { used += sram[k]; });
    rect(0, y, barW, 16, "none", {stroke: "currentColor", "stroke-width": 1});
    pieces.forEach(function (p) {
      var w = barW * sram[p[0]] / M;
      rect(x, y, w, 16, p[1]);
      if (w > 26) text(x + w / 2, y + 12, p[0], {"text-anchor": "middle", fill: "#000"});
      x += w;
    });
    y += 30;
    text(0, y, "B_r = " + v2[0] + " query rows, B_c = " + v2[1] + " key rows: " +
         h.fmt(100 * used / M, 3) + "% of M");
    alt.push("one step of the FlashAttention-2 order holds B_r = " + v2[0] +
             " query rows and B_c = " + v2[1] + " key rows, " + h.fmt(100 * used / M, 3) +
             " percent of M");
    // 2. the passes
    var T_r = passes.v2[2];
    y += 22;
    text(0, y, "2. The " + N + " query rows, " + T_r + " block" + (T_r > 1 ? "s" : "") +
         " of " + Math.min(v2[0], N), {"font-weight": "bold"});
    y += 6;
    var seg = barW / T_r;
    for (var i = 0; i < T_r; i++) {
      rect(i * seg, y, seg, 14, i % 2 ? "#56B4E9" : "#0072B2",
           T_r <= 75 ? {stroke: "#fff", "stroke-width": 0.5} : {});
    }
    y += 28;
    text(0, y, "each block is one pass over all of K and V: " + T_r + " pass" +
         (T_r > 1 ? "es" : ""));
    alt.push("the " + N + " query rows form " + T_r + (T_r > 1 ? " blocks" : " block") +
             ", so K and V are read " + (T_r > 1 ? T_r + " times" : "once"));
  }
  // 3. the traffic, once + again per pass
  y += 22;
  text(0, y, "3. Elements moved: grey once, colour per pass", {"font-weight": "bold"});
  var big = 0;
  orders.forEach(function (o) { if (row[o[0]][2] !== null) big = Math.max(big, row[o[0]][2]); });
  var standard = row.standard[2];
  var what = {standard: "S and P written and read back: 4N\u00b2",
              v1: "Q, O, \u2113, m again for each of T_c = ",
              v2: "K and V again for each of T_r = "};
  orders.forEach(function (o) {
    var r = row[o[0]], p = passes[o[0]], name = o[1];
    y += 18;
    text(0, y, name + (r[0] !== null ? "  (B_r = " + r[0] + ", B_c = " + r[1] + ")" : ""));
    y += 4;
    if (r[2] === null) {
      y += 14;
      text(8, y, "M cannot hold one step");
      alt.push(name + ": M cannot hold one step");
      return;
    }
    var wOnce = barW * p[0] / big, wPass = barW * p[1] / big;
    rect(0, y, wOnce, 12, "#BBBBBB");
    for (var k = 0; k < p[2]; k++) {
      rect(wOnce + k * wPass, y, wPass, 12, o[2],
           wPass >= 3 ? {stroke: "#fff", "stroke-width": 0.6} : {});
    }
    var fx = barW * floor / big;  // the 4 N d floor on the bars' scale
    parts.push(h.el("line", {x1: fx, y1: y - 3, x2: fx, y2: y + 15, stroke: "currentColor",
                             "stroke-width": 1.5, "stroke-dasharray": "3 2"}));
    var end = Math.min(wOnce + p[2] * wPass + 4, barW + 4);
    if (r[3] !== null) {
      text(end, y + 11, r[3] === r[2] ? "\u2713" : "\u2717", {"font-weight": "bold"});
    }
    y += 26;
    var again = o[0] === "standard" ? what.standard :
      what[o[0]] + p[2] + (o[0] === "v1" ? " key" : " query") + " blocks";
    text(8, y, again);
    y += 15;
    text(8, y, h.fmt(r[2]) + " in all, " + h.fmt(r[2] / standard, 3) + " x standard");
    alt.push(name + ": " + h.fmt(r[2]) + " elements, " + h.fmt(r[2] / standard, 3) +
             " times standard attention; " + again);
  });
  y += 18;
  text(0, y, "dashed: the 4Nd floor; \u2713: a counted run agrees");
  // 4. log-log elements against M
  y += 22;
  text(0, y, "4. Elements moved (log) against M (log)", {"font-weight": "bold"});
  var px = 46, pw = 300, ph = 110, py = y + 8;
  var Ms = data.M_values, lo = Math.log(Ms[0]), hi = Math.log(Ms[Ms.length - 1]);
  var ymin = Math.log(floor) - 0.2, ymax = ymin;
  var curves = orders.map(function (o) {
    return Ms.map(function (m) {
      var v = data.rows[N + "-" + d + "-" + m][o[0]][2];
      if (v !== null) ymax = Math.max(ymax, Math.log(v));
      return v;
    });
  });
  ymax += 0.2;
  function X(m) { return px + pw * (Math.log(m) - lo) / (hi - lo); }
  function Y(v) { return py + ph - ph * (Math.log(v) - ymin) / (ymax - ymin); }
  rect(px, py, pw, ph, "none", {stroke: "currentColor", "stroke-width": 0.8});
  parts.push(h.el("line", {x1: px, y1: Y(floor), x2: px + pw, y2: Y(floor),
                           stroke: "currentColor", "stroke-dasharray": "3 3"}));
  curves.forEach(function (c, k) {
    var pts = [];
    c.forEach(function (v, i) {
      if (v !== null) pts.push(X(Ms[i]).toFixed(1) + "," + Y(v).toFixed(1));
    });
    if (pts.length) parts.push(h.el("polyline", {points: pts.join(" "), fill: "none",
      stroke: orders[k][2], "stroke-width": 2}));
  });
  parts.push(h.el("line", {x1: X(M), y1: py, x2: X(M), y2: py + ph,
                           stroke: "#CC79A7", "stroke-width": 2}));
  text(px - 4, py + 12, "more", {"text-anchor": "end"});
  text(px - 4, py + ph, "less", {"text-anchor": "end"});
  text(px, py + ph + 14, h.fmt(Ms[0]));
  text(px + pw, py + ph + 14, h.fmt(Ms[Ms.length - 1]), {"text-anchor": "end"});
  text(px + pw / 2, py + ph + 14, "SRAM size M", {"text-anchor": "middle"});
  y = py + ph + 32;
  text(0, y, "colours as in 3; pink: this M; dashed: 4Nd");
  y += 8;
  var svg = h.el("svg", {xmlns: "http://www.w3.org/2000/svg", viewBox: "0 0 " + W + " " + y,
    width: W, height: y, "font-size": 12, fill: "currentColor", "font-family": "sans-serif"},
    parts.join(""));
  var say = "N = " + N + ", d = " + d + ", M = " + M + " elements: " + alt.join("; ") + ".";
  return {svg: svg, alt: say};
}
