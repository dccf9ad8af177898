// Renderer of the GPU chapter's launch-grid widget (svg_figure kind "launch_grid"): the
// programs of the forward kernel's launch grid for one head, and what the chosen program reads
// (its rows of Q; K and V up to where its loop stops, tile by tile) and writes (its rows of O
// and L) in HBM, with the parts of its blocks past n that the masks keep from being loaded.
// values: {n, B_r, B_c, causal: "on"/"off", program (from 1)}.
// data: {d, configs: {"n-B_r-B_c-causal": [key where program p's loop stops, ...]}}, from
// flashlib.book.chapters.gpu.launch_grid_widget_data (flashlib.gpu.grid.key_block_end).
function draw(data, values, h) {
  var n = values.n, br = values.B_r, bc = values.B_c, causal = values.causal === "on";
  var stops = data.configs[n + "-" + br + "-" + bc + "-" + values.causal];
  var P = stops.length, p = Math.min(values.program, P) - 1;
  var q0 = p * br, q1 = Math.min(n, q0 + br), stop = stops[p];
  var tiles = Math.ceil(stop / bc), rows = q1 - q0, d = data.d;
  var W = 360, parts = [];
  var blue = "#0072B2", orange = "#E69F00", green = "#009E73";
  function text(x, y, s, attrs) {
    parts.push(h.el("text", Object.assign({x: x, y: y}, attrs || {}), h.esc(s)));
  }
  function rect(x, y, w, hh, attrs) {
    parts.push(h.el("rect", Object.assign({x: x, y: y, width: Math.max(w, 0),
      height: Math.max(hh, 0)}, attrs)));
  }
  text(0, 14, "n = " + n + ", tiles B_r x B_c = " + br + " x " + bc +
       (causal ? ", causal" : ""), {"font-weight": "bold"});
  // the launch grid: one cell per program (query block), the chosen one filled
  text(0, 32, "launch grid: " + P + " program" + (P > 1 ? "s" : "") +
       " (one head); program " + (p + 1) + " framed");
  var cw = W / P;
  for (var k = 0; k < P; k++) {
    rect(k * cw, 38, cw, 16, {fill: k === p ? orange : "none", "fill-opacity": 0.6,
      stroke: "currentColor", "stroke-width": P > 40 ? 0.3 : 0.8});
  }
  rect(p * cw - 1, 37, cw + 2, 18, {fill: "none", stroke: "currentColor", "stroke-width": 2});
  // HBM: Q, K, V, O, L as columns of n rows; the scale leaves room for the masked padding
  var top = 94, H = 170;  // the column names 16 below the line above them
  var total = Math.max(Math.ceil(n / br) * br, Math.ceil(n / bc) * bc);
  var px = H / total;
  var cols = [["Q", 6, "read"], ["K", 78, "read"], ["V", 150, "read"],
              ["O", 234, "write"], ["L", 306, "write"]];
  text(0, 72, "in HBM (rows counted from 1, top to bottom):");
  cols.forEach(function (c) {
    var w = c[0] === "L" ? 30 : 48;
    text(c[1], top - 4, c[0] + " " + c[2], {"font-weight": "bold"});
    rect(c[1], top, w, n * px, {fill: "none", stroke: "currentColor", "stroke-width": 1});
  });
  function block(x, w, a, b, colour) {  // rows a .. b - 1 of an array
    rect(x, top + a * px, w, (b - a) * px, {fill: colour, "fill-opacity": 0.6});
  }
  function past(x, w, a, b) {  // rows a .. b - 1 past n: masked, never loaded or stored
    if (b > a) rect(x, top + a * px, w, (b - a) * px, {fill: "none", stroke: "currentColor",
      "stroke-dasharray": "3 2", "stroke-width": 1});
  }
  block(6, 48, q0, q1, blue);
  past(6, 48, q1, q0 + br);
  var masked = 0;
  for (var t = 0; t < tiles; t++) {
    var j0 = t * bc, j1 = Math.min(n, j0 + bc);
    var partly = j0 + bc > n || (causal && j0 + bc - 1 > q0);
    if (partly) masked++;
    [78, 150].forEach(function (x) {
      block(x, 48, j0, j1, partly ? orange : blue);
      if (bc * px >= 3 && t > 0) rect(x, top + j0 * px - 0.5, 48, 1, {fill: "#ffffff"});
      past(x, 48, j1, j0 + bc);
    });
  }
  block(234, 48, q0, q1, green);
  block(306, 30, q0, q1, green);
  // legend
  var y = top + total * px + 22;
  function swatch(x, colour, label, dashed) {
    rect(x, y - 10, 11, 11, dashed ? {fill: "none", stroke: "currentColor",
      "stroke-dasharray": "3 2"} : {fill: colour, "fill-opacity": 0.6});
    text(x + 15, y, label);
  }
  swatch(0, blue, "read (whole tile)");
  swatch(150, orange, "read, partly masked");
  y += 18;
  swatch(0, green, "written");
  swatch(150, null, "past n: not loaded", true);
  y += 24;
  var keysRead = Math.min(stop, n), kib = function (b) { return h.bytes(b); };
  var read = (rows + 2 * keysRead) * d * 2, written = rows * d * 2 + rows * 4;
  text(0, y, "Program " + (p + 1) + ": Q rows " + (q0 + 1) + "-" + q1 + ", K and V rows 1-" +
       keysRead + " (" + tiles + " tile" + (tiles > 1 ? "s" : "") + ")", {"font-weight": "bold"});
  y += 16;
  text(0, y, "reads " + kib(read) + ", writes " + kib(written) + " (float16, d = " + d +
       "; L float32)");
  y += 16;
  var sum = stops.reduce(function (a, b) { return a + Math.min(b, n); }, 0);
  text(0, y, "all " + P + " programs: Q and O once; K and V " + h.fmt(sum / n, 3) +
       " times each");
  y += 8;
  var svg = h.el("svg", {xmlns: "http://www.w3.org/2000/svg", viewBox: "0 0 " + W + " " + y,
    width: W, height: y, "font-size": 12, fill: "currentColor", "font-family": "sans-serif"},
    parts.join(""));
  var alt = "Launch grid of " + P + " programs for n = " + n + " with tiles of " + br + " by " +
    bc + (causal ? ", causal" : "") + ". Program " + (p + 1) + " reads rows " + (q0 + 1) +
    " to " + q1 + " of Q" + (rows < br ? " (" + (br - rows) + " rows of its block past n are " +
    "masked)" : "") + " and rows 1 to " + keysRead + " of K and V in " + tiles + " tiles, " +
    masked + " of them partly masked, and writes rows " + (q0 + 1) + " to " + q1 +
    " of O and L. Over all programs K and V are read " + h.fmt(sum / n, 3) + " times each.";
  return {svg: svg, alt: alt, limits: {program: P}};
}
