// Loaded between the vendored require.js and @jupyter-widgets/html-manager on pages that carry
// ipywidgets state (nb_ipywidgets_js in _config.yml), so that such pages stay offline and
// error-free:
// 1. html-manager finds its font files through the AMD module URLs of @jupyter-widgets/*;
//    point those at _static/vendor/html-manager/ (else they resolve under the page's URL);
// 2. it typesets widget labels with the MathJax 2 API (MathJax.Hub.Queue); the book uses
//    MathJax 3, so forward those calls to MathJax.typesetPromise.
(function () {
  var vendor = new URL("vendor/html-manager", document.currentScript.src).href;
  window.__jupyter_widgets_assets_path__ = vendor + "/";
  if (window.require && window.require.config) {
    window.require.config({
      paths: { "@jupyter-widgets/html-manager/dist": vendor, "@jupyter-widgets": vendor },
    });
  }
  window.addEventListener("load", function () {
    var mj = window.MathJax;
    if (mj && !mj.Hub) {
      mj.Hub = {
        Queue: function (job) {
          if (mj.typesetPromise) mj.typesetPromise(job && job[2] ? [job[2]] : undefined);
        },
      };
    }
  });
})();
