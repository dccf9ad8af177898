// Renderer of the tiling widget (svg_figure kind "tiling"): one step of a tiled schedule.
// data: flashlib.book.chapters.tiling.tiling_widget_data(...); values: {n, B_r, B_c, order, step}.
// Draws the T_r x T_c grid of score tiles (computed so far, the current one, query blocks
// whose O is final), what SRAM holds during the step, the step's HBM transfers and the
// elements read and written so far.
function draw(data, values, h) {
  var key = [values.n, values.B_r, values.B_c, values.order].join("-");
  var run = data.configs[key];
  if (!run) throw new Error("no schedule for " + key);
  var steps = run.steps, k = Math.min(values.step, steps.length - 1), st = steps[k];
  // the score matrix to scale: n rows by n_k columns in at most 200 x 200 units; a last
  // block shorter than B_r or B_c shows as a thinner tile
  var W = 360, scale = 200 / Math.max(run.n, run.n_k);
  var gx = 8, gy = 34, parts = [];
  var names = {v1: "Algorithm 1 (outer loop over K, V blocks)",
               v2: "FlashAttention-2 (outer loop over Q blocks)"};
  parts.push(h.el("text", {x: 0, y: 14, "font-weight": "bold"},
    h.esc(names[run.order] || run.order)));
  parts.push(h.el("text", {x: 0, y: 28},
    h.esc("step " + k + " of " + (steps.length - 1) + ", n = " + run.n + ", d = " + run.d +
          ", B_r = " + run.B_r +
          ", B_c = " + run.B_c)));
  var computed = {};
  for (var s = 1; s <= k; s++) if (steps[s].tile) computed[steps[s].tile.join(",")] = true;
  var done = {};
  st.done.forEach(function (i) { done[i] = true; });
  for (var i = 0; i < run.T_r; i++) {
    for (var j = 0; j < run.T_c; j++) {
      var current = st.tile && st.tile[0] === i && st.tile[1] === j;
      var fill = current ? "#E69F00" : computed[i + "," + j] ? "#56B4E9" : "none";
      parts.push(h.el("rect", {x: gx + j * run.B_c * scale, y: gy + i * run.B_r * scale,
        width: Math.min(run.B_c, run.n_k - j * run.B_c) * scale,
        height: Math.min(run.B_r, run.n - i * run.B_r) * scale,
        fill: fill, "fill-opacity": current ? 1 : 0.45, stroke: "currentColor",
        "stroke-width": 0.5}));
    }
    if (done[i]) {
      parts.push(h.el("rect", {x: gx - 6, y: gy + i * run.B_r * scale, width: 4,
        height: Math.min(run.B_r, run.n - i * run.B_r) * scale, fill: "#009E73"}));
    }
  }
  // the chosen row (its running maximum m and sum l are listed below): a tick at its height
  var ry = gy + (run.row + 0.5) * scale;
  parts.push(h.el("line", {x1: gx + run.n_k * scale, y1: ry, x2: gx + run.n_k * scale + 8,
    y2: ry, stroke: "#D55E00", "stroke-width": 2}));
  var tx = gx + run.n_k * scale + 12, y = gy + 10;
  function line(text, attrs) {
    parts.push(h.el("text", Object.assign({x: tx, y: y}, attrs || {}), h.esc(text)));
    y += 15;
  }
  // tiles, blocks and rows are logged 0-based (as the code counts) and shown from 1, as the
  // papers' boxes count them: tile (1, 2) of the log is "tile (2, 3)"
  var tileName = st.tile ? "(" + (st.tile[0] + 1) + ", " + (st.tile[1] + 1) + ")" : null;
  line("tile " + (tileName || "none yet"), {"font-weight": "bold"});
  line("SRAM holds:");
  // on-chip arrays are logged by their names ("O_i"), blocks by array and index ("O", 1)
  var held = st.sram.map(function (p) {
    return p[0].replace(/_i$/, "") + (p[1] === null ? "" : "_" + (p[1] + 1));
  });
  for (var c = 0; c < held.length; c += 4) line("  " + held.slice(c, c + 4).join(" "));
  line(h.fmt(st.sram_elements) + " elements");
  var reads = st.events.filter(function (e) { return e[0] === "read"; }).length;
  var writes = st.events.filter(function (e) { return e[0] === "write"; }).length;
  line(reads + " loads, " + writes + " stores");
  line("row " + (run.row + 1) + ": " + st.keys_seen + "/" + run.n_k + " keys",
       {fill: "#D55E00"});
  line(st.m === null ? "m, l: not yet" :
       "m = " + h.fmt(st.m, 3) + ", l = " + h.fmt(st.l, 3), {fill: "#D55E00"});
  y = Math.max(y, gy + run.n * scale) + 16;
  parts.push(h.el("text", {x: 0, y: y, "font-weight": "bold"},
    h.esc("HBM traffic so far (elements)")));
  y += 16;
  var total = 0;
  run.arrays.forEach(function (name, a) {
    total += st.reads[a] + st.writes[a];
    parts.push(h.el("text", {x: 0, y: y}, h.esc(name + ": " + h.fmt(st.reads[a]) + " read, " +
      h.fmt(st.writes[a]) + " written")));
    y += 15;
  });
  parts.push(h.el("text", {x: 0, y: y + 2, "font-weight": "bold"},
    h.esc("total " + h.fmt(total))));
  y += 10;
  var svg = h.el("svg", {xmlns: "http://www.w3.org/2000/svg", viewBox: "0 0 " + W + " " + y,
    width: W, height: y, "font-size": 12, fill: "currentColor", "font-family": "sans-serif"},
    parts.join(""));
  var alt = (names[run.order] || run.order) + ", step " + k + " of " + (steps.length - 1) +
    ": " + (st.tile ? "tile " + tileName + " is computed, SRAM holds " +
    held.join(", ") : "before the first tile") + "; " + h.fmt(total) +
    " elements moved so far; row " + (run.row + 1) + " has seen " + st.keys_seen + " of " +
    run.n_k + " keys" + (st.m === null ? "." : ", running maximum m = " + h.fmt(st.m, 3) +
    ", running sum l = " + h.fmt(st.l, 3) + ".");
  return {svg: svg, alt: alt, limits: {step: steps.length}};
}
