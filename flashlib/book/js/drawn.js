// flashlib.book.widgets, svg_figure: the page draws every frame itself, as SVG, from a JSON
// table. Inlined into each figure's HTML after its JSON data, with the figure's renderer
// (flashlib/book/js/<kind>.js) in place of __FLASHLIB_RENDERER__; __FLASHLIB_ID__ is its id.
// spec: {sliders: [{name, values: [...], labels: [...]}], data: the renderer's table}.
// A renderer defines draw(data, values, h) -> {svg: "<svg ...>", alt: "text", limits:
// {slider: number of values it may take now} (optional)}; h holds the helpers below.
(function (root) {
  if (!root || root.getAttribute("data-ready")) return;
  root.setAttribute("data-ready", "1");
  var spec = JSON.parse(root.querySelector("script.flashlib-ifig-data").textContent);
  // the reader's language (js/i18n.js, on Japanese pages and notebooks), else the English
  var T = window.flashlibTranslate || function (s) { return s; };
  var h = {
    // text for SVG/HTML content, in the reader's language
    esc: function (s) { return h.raw(T(String(s))); },
    // a value escaped as it is (attribute values: fill="none" is not a word to translate)
    raw: function (s) {
      return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;")
        .replace(/>/g, "&gt;").replace(/"/g, "&quot;");
    },
    // <tag a="1" ...>children</tag>; attrs: {name: value}, undefined/null values skipped
    el: function (tag, attrs, children) {
      var out = "<" + tag;
      Object.keys(attrs || {}).forEach(function (k) {
        if (attrs[k] !== undefined && attrs[k] !== null) out += " " + k + '="' + h.raw(attrs[k]) + '"';
      });
      return out + ">" + (children === undefined ? "" : children) + "</" + tag + ">";
    },
    // a number with thousands separators, or with `digits` significant digits
    fmt: function (x, digits) {
      if (x === null || x === undefined) return "\u2013";
      if (digits) {
        var s = Number(x).toPrecision(digits);
        return s.indexOf("e") < 0 && s.indexOf(".") >= 0 ? s.replace(/\.?0+$/, "") : s;
      }
      return Math.round(x).toLocaleString("en-US");
    },
    // bytes as B, KiB or MiB
    bytes: function (b) {
      if (b < 1024) return b + " B";
      if (b < 1048576) return (b / 1024).toFixed(b < 10240 ? 1 : 0) + " KiB";
      return (b / 1048576).toFixed(b < 10485760 ? 1 : 0) + " MiB";
    }
  };
  var draw = (function () {
    /*__FLASHLIB_RENDERER__*/
    return draw;
  })();
  var inputs = root.querySelectorAll("input[type=range], select");
  var drawing = root.querySelector(".flashlib-ifig-drawing");
  function update() {
    var values = {};
    inputs.forEach(function (input, k) {
      var slider = spec.sliders[k], i = Number(input.value);
      values[slider.name] = slider.values[i];
      var out = input.parentNode.querySelector("output");  // none beside a dropdown
      if (out) {
        input.setAttribute("aria-valuetext", T(String(slider.labels[i])));
        out.textContent = T(String(slider.labels[i]));
      }
    });
    var out = draw(spec.data, values, h);
    var again = false;
    Object.keys(out.limits || {}).forEach(function (name) {
      inputs.forEach(function (input, k) {
        if (spec.sliders[k].name !== name) return;
        var top = Math.max(0, Math.min(out.limits[name], spec.sliders[k].values.length) - 1);
        // read the value before lowering max: a range input clamps its value to a new max
        // itself, and the label and aria-valuetext set above would keep the old value
        var before = Number(input.value);
        input.max = String(top);
        if (before > top) { input.value = String(top); again = true; }
      });
    });
    if (again) return update();
    drawing.innerHTML = out.svg;
    // scaled to the column, as the diagrams are (at most 30rem): not 360 px in a wide page
    var svg = drawing.querySelector("svg");
    if (svg) {
      svg.style.width = "100%";
      svg.style.maxWidth = "30rem";
      svg.style.height = "auto";
    }
    drawing.setAttribute("aria-label", T(out.alt));
  }
  inputs.forEach(function (input) {
    input.addEventListener(input.tagName === "SELECT" ? "change" : "input", update);
  });
  update();
  root.querySelector(".flashlib-ifig-controls").hidden = false;
})(document.getElementById("__FLASHLIB_ID__"));
