// flashlib.book.i18n in the browser: window.flashlibTranslate(text) gives the reader's language
// for text a figure draws (flashlib/book/js/drawn.js calls it for every label and alt text).
// Loaded by the Japanese pages (tools/i18n_extension.py) and by a figure shown in a Japanese
// notebook, after window.flashlibWords = {English template: translation}. A template has {0},
// {1}, ... for the numbers of the text, found as flashlib/book/i18n.py's NUMBER finds them.
(function (root) {
  if (root.flashlibTranslate) return;
  var NUMBER = /(^|[^\w.])(\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?)/g;
  var missing = root.flashlibMissing = root.flashlibMissing || {};
  root.flashlibTranslate = function (text) {
    var words = root.flashlibWords;
    if (!words || typeof text !== "string" || !/[A-Za-z]{2}/.test(text)) return text;
    var core = text.trim();
    if (words.hasOwnProperty(core)) return text.replace(core, words[core]);
    var numbers = [];
    var key = core.replace(NUMBER, function (all, before, number) {
      numbers.push(number);
      return before + "{" + (numbers.length - 1) + "}";
    });
    if (!words.hasOwnProperty(key)) { missing[key] = true; return text; }
    return text.replace(core, words[key].replace(/\{(\d+)\}/g, function (all, i) {
      return i < numbers.length ? numbers[i] : all;
    }));
  };
})(window);
