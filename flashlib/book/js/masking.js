// Renderer of the masking widget (svg_figure kind "masking"): the token mask of a sliding
// window (causal when right = 0) with key padding, the B_r x B_c tile grid over it coloured
// empty / partial / full, the rows that see no key, and the share of tiles computed.
// values: {n_q, n_k, B_r, B_c, left, right, padding, align}; left/right "none" = no bound.
// The predicate is flashlib.masks.padded(sliding_window, n_k - padding): a bottom-right
// diagonal sits on the last real key; the tests check the counts this draws against
// flashlib.masks.classify_tiles.
function draw(data, values, h) {
  var nq = values.n_q, nk = values.n_k, br = values.B_r, bc = values.B_c;
  var left = values.left === "none" ? null : values.left;
  var right = values.right === "none" ? null : values.right;
  var length = Math.max(0, nk - values.padding);
  var shift = values.align === "bottom_right" ? length - nq : 0;  // on the last real key
  function visible(i, j) {
    var c = i + shift;  // the diagonal key of row i
    return j < length && (left === null || c - j <= left) && (right === null || j - c <= right);
  }
  var W = 360, gx = 14, gy = 51, cell = Math.min(300 / nk, 260 / nq, 12);
  var parts = [];
  var colours = {empty: "none", partial: "#E69F00", full: "#009E73"};
  var counts = {empty: 0, partial: 0, full: 0};
  var tr = Math.ceil(nq / br), tc = Math.ceil(nk / bc);
  for (var ti = 0; ti < tr; ti++) {
    for (var tj = 0; tj < tc; tj++) {
      var i0 = ti * br, i1 = Math.min(i0 + br, nq), j0 = tj * bc, j1 = Math.min(j0 + bc, nk);
      var seen = 0;
      for (var i = i0; i < i1; i++) for (var j = j0; j < j1; j++) if (visible(i, j)) seen++;
      var kind = seen === 0 ? "empty" : seen === (i1 - i0) * (j1 - j0) ? "full" : "partial";
      counts[kind]++;
      parts.push(h.el("rect", {x: gx + j0 * cell, y: gy + i0 * cell, width: (j1 - j0) * cell,
        height: (i1 - i0) * cell, fill: colours[kind], "fill-opacity": 0.45,
        stroke: "currentColor", "stroke-width": 1}));
    }
  }
  var blind = 0, dot = Math.max(cell * 0.55, 1.2);
  for (var r = 0; r < nq; r++) {
    var any = false;
    for (var k = 0; k < nk; k++) {
      if (visible(r, k)) {
        any = true;
        parts.push(h.el("rect", {x: gx + (k + 0.5) * cell - dot / 2,
          y: gy + (r + 0.5) * cell - dot / 2, width: dot, height: dot, fill: "#0072B2"}));
      }
    }
    if (!any) {
      blind++;
      parts.push(h.el("rect", {x: gx - 9, y: gy + r * cell, width: 6, height: cell,
        fill: "#D55E00"}));
    }
  }
  var total = tr * tc, computed = counts.partial + counts.full;
  var share = total ? Math.round(100 * computed / total) : 0;
  var names = {top_left: "top-left (SDPA)", bottom_right: "bottom-right (flash-attn)"};
  parts.push(h.el("text", {x: 0, y: 13, "font-weight": "bold"},
    h.esc(nq + " queries x " + nk + " keys, tiles " + br + " x " + bc)));
  parts.push(h.el("text", {x: 0, y: 28},
    h.esc("window (" + values.left + ", " + values.right + "), " + names[values.align])));
  parts.push(h.el("text", {x: 0, y: 43}, h.esc(values.padding + " padded keys")));
  var y = gy + nq * cell + 18;
  function line(text, attrs) {
    parts.push(h.el("text", Object.assign({x: 0, y: y}, attrs || {}), h.esc(text)));
    y += 16;
  }
  function swatch(x, colour, text) {
    parts.push(h.el("rect", {x: x, y: y - 10, width: 11, height: 11, fill: colour,
      "fill-opacity": colour === "#0072B2" || colour === "#D55E00" ? 1 : 0.45,
      stroke: "currentColor", "stroke-width": 0.5}));
    parts.push(h.el("text", {x: x + 15, y: y}, h.esc(text)));
  }
  swatch(0, "#009E73", "full " + counts.full);
  swatch(90, "#E69F00", "partial " + counts.partial);
  swatch(200, "none", "empty " + counts.empty);
  y += 16;
  swatch(0, "#0072B2", "visible key");
  swatch(110, "#D55E00", "row sees no key: " + blind);
  y += 18;
  line("computed: " + computed + " of " + total + " tiles (" + share + "%)",
       {"font-weight": "bold"});
  line(counts.empty + " skipped, " + counts.partial + " masked entry by entry");
  var svg = h.el("svg", {xmlns: "http://www.w3.org/2000/svg", viewBox: "0 0 " + W + " " + y,
    width: W, height: y, "font-size": 12, fill: "currentColor", "font-family": "sans-serif"},
    parts.join(""));
  var alt = nq + " by " + nk + " mask, window (" + values.left + ", " + values.right + ") " +
    names[values.align] + ", " + values.padding + " padded keys, in " + br + " by " + bc +
    " tiles: " + counts.full + " full, " + counts.partial + " partial, " + counts.empty +
    " empty; " + computed + " of " + total + " tiles computed (" + share + "%); " + blind +
    " rows see no key.";
  return {svg: svg, alt: alt};
}
