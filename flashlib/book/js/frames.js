// flashlib.book.widgets, interactive_figure: switch between precomputed PNG frames.
// Inlined into each figure's HTML after its JSON data; __FLASHLIB_ID__ is the figure's id.
// data: {labels: [[slider 0's value labels], ...], frames: [PNG URLs: data URLs, or files
// of the site], index: [frame of each grid point, last slider fastest], alts: [alt texts],
// altIndex: [alt of each point], framesJa and indexJa: the Japanese frames, if any}.
(function (root) {
  if (!root || root.getAttribute("data-ready")) return;
  root.setAttribute("data-ready", "1");
  var data = JSON.parse(root.querySelector("script.flashlib-ifig-data").textContent);
  // the book draws both editions' frames; the site's pages keep their own (a page with both:
  // the Japanese ones where the page is Japanese)
  var ja = document.documentElement.lang === "ja";
  var img = root.querySelector(ja ? "img.flashlib-lang-ja" : "img:not(.flashlib-lang-ja)") ||
    root.querySelector("img");
  img.hidden = false;
  if (ja && data.framesJa) { data.frames = data.framesJa; data.index = data.indexJa; }
  var T = window.flashlibTranslate || function (s) { return s; };
  var inputs = root.querySelectorAll("input[type=range], select");
  function update() {
    var point = 0;
    inputs.forEach(function (input, k) {
      var i = Number(input.value), label = data.labels[k][i];
      point = point * data.labels[k].length + i;
      var out = input.parentNode.querySelector("output");  // none beside a dropdown
      if (out) {
        input.setAttribute("aria-valuetext", T(label));
        out.textContent = T(label);
      }
    });
    img.src = data.frames[data.index[point]];
    img.alt = T(data.alts[data.altIndex[point]]);
  }
  inputs.forEach(function (input) {
    input.addEventListener(input.tagName === "SELECT" ? "change" : "input", update);
  });
  root.querySelector(".flashlib-ifig-controls").hidden = false;
})(document.getElementById("__FLASHLIB_ID__"));
