// Renderer of the dropout widget (svg_figure kind "dropout"): the n x n dropout mask of one
// head cut into B x B tiles, each entry kept (filled) or dropped (empty), one tile outlined
// with the counters it draws, and what storing the mask would cost against the generator's
// state. values: {n, B, p}. data: flashlib.book.chapters.masking.dropout_widget_data, the
// first Philox4x32-10 word of every entry (i, j) of the largest n; an entry is kept when its
// word >= floor(p * 2**32), as flashlib.core.philox.dropout_keep decides (the tests check the
// counts this draws against it).
function draw(data, values, h) {
  var n = values.n, b = values.B, p = values.p;
  var threshold = Math.floor(p * 4294967296);
  var W = 360, gx = 14, gy = 51, cell = Math.min(300 / n, 12);
  var parts = [], kept = 0;
  var tiles = Math.ceil(n / b);
  var ti = Math.min(1, tiles - 1), tj = Math.min(2, tiles - 1);  // the outlined tile
  for (var i = 0; i < n; i++) {
    for (var j = 0; j < n; j++) {
      var keep = data.words[i][j] >= threshold;
      if (keep) kept++;
      var s = cell * 0.7;
      parts.push(h.el("rect", {x: gx + (j + 0.5) * cell - s / 2,
        y: gy + (i + 0.5) * cell - s / 2, width: s, height: s,
        fill: keep ? "#0072B2" : "none", stroke: keep ? "none" : "#888888",
        "stroke-width": 0.6}));
    }
  }
  for (var r = 0; r < tiles; r++) {
    for (var c = 0; c < tiles; c++) {
      var i0 = r * b, i1 = Math.min(i0 + b, n), j0 = c * b, j1 = Math.min(j0 + b, n);
      var mine = r === ti && c === tj;
      parts.push(h.el("rect", {x: gx + j0 * cell, y: gy + i0 * cell, width: (j1 - j0) * cell,
        height: (i1 - i0) * cell, fill: "none", stroke: mine ? "#D55E00" : "currentColor",
        "stroke-width": mine ? 3 : 1}));
    }
  }
  var ri0 = ti * b, ri1 = Math.min(ri0 + b, n) - 1, cj0 = tj * b, cj1 = Math.min(cj0 + b, n) - 1;
  var total = n * n, share = (100 * kept / total).toFixed(1);
  parts.push(h.el("text", {x: 0, y: 13, "font-weight": "bold"},
    h.esc(n + " queries x " + n + " keys, tiles " + b + " x " + b + ", p = " + p)));
  parts.push(h.el("text", {x: 0, y: 28},
    h.esc("fixed: one head (h = " + data.head + "), seed " + data.seed + ", offset " +
          data.offset)));
  parts.push(h.el("text", {x: 0, y: 43}, h.esc(tiles * tiles + " tiles, each draws its own bits")));
  var y = gy + n * cell + 18;
  function line(text, attrs) {
    parts.push(h.el("text", Object.assign({x: 0, y: y}, attrs || {}), h.esc(text)));
    y += 16;
  }
  function swatch(x, fill, stroke, text) {
    parts.push(h.el("rect", {x: x, y: y - 10, width: 11, height: 11, fill: fill,
      stroke: stroke, "stroke-width": stroke === "#D55E00" ? 2 : 0.8}));
    parts.push(h.el("text", {x: x + 15, y: y}, h.esc(text)));
  }
  swatch(0, "#0072B2", "none", "kept " + kept + " (" + share + "%)");
  swatch(150, "none", "#888888", "dropped " + (total - kept));
  y += 16;
  swatch(0, "none", "#D55E00", "tile (" + ti + ", " + tj + ") draws counters");
  y += 16;
  line("(r, c, h, offset) for rows r = " + ri0 + ".." + ri1 + ", keys c = " + cj0 + ".." + cj1);
  line("the backward draws the same counters: the same bits");
  y += 2;
  var bytes = total, packed = Math.ceil(total / 8), lse = 4 * n;
  line("stored mask: " + h.bytes(bytes) + " (one byte per entry), " + h.bytes(packed) +
       " as bits", {"font-weight": "bold"});
  line("regenerated instead: from the seed and offset, 16 B");
  line("(and L, 4n = " + h.bytes(lse) + ", saved with or without dropout)");
  line("at n = 8,192 and 32 heads: a mask of 2 GiB per sequence");
  var svg = h.el("svg", {xmlns: "http://www.w3.org/2000/svg", viewBox: "0 0 " + W + " " + y,
    width: W, height: y, "font-size": 12, fill: "currentColor", "font-family": "sans-serif"},
    parts.join(""));
  var alt = n + " by " + n + " dropout mask of one head (seed " + data.seed + ", offset " +
    data.offset + "), p = " + p + ", in " + b + " by " + b + " tiles: " + kept + " of " + total +
    " entries kept (" + share + "%); tile (" + ti + ", " + tj + ") draws the counters of rows " +
    ri0 + " to " + ri1 + " and keys " + cj0 + " to " + cj1 + "; storing the mask takes " +
    bytes + " bytes, the generator's state 16 bytes.";
  return {svg: svg, alt: alt};
}
