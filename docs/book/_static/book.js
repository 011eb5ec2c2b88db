/* Fit every plotly figure to its column. A figure measures its container when its own script runs, before the
   theme has laid the page out (the right-hand table of contents takes its ~270 px afterwards), so it comes out as
   wide as the article would be without it. Once the page has loaded, and on every change of the window's size
   (phone width included), each figure is set to its column's width. */
(function () {
  function fit() {
    if (!window.Plotly) { return; }
    document.querySelectorAll(".js-plotly-plot").forEach(function (el) {
      var column = el.parentElement ? el.parentElement.clientWidth : 0;
      if (column > 0 && Math.abs(el.getBoundingClientRect().width - column) > 1) {
        el.style.width = column + "px";
        window.Plotly.relayout(el, { width: column });
      }
    });
  }
  window.addEventListener("load", function () { fit(); setTimeout(fit, 300); });
  window.addEventListener("resize", fit);
})();
