/* Fit every plotly figure to its column. A figure lays itself out at the width its container had when its own
   script ran, before the theme finished the page (the right-hand table of contents takes its ~270 px afterwards),
   so its drawing comes out wider than the column and the right panels and legends are cut off. Once the page has
   loaded, and whenever the window changes size (a phone's width included), every figure whose drawn width differs
   from its column's is laid out again at the column's width. */
(function () {
  function fit() {
    if (!window.Plotly) { return; }
    document.querySelectorAll(".js-plotly-plot").forEach(function (el) {
      var column = el.parentElement ? el.parentElement.clientWidth : 0;
      var drawn = el._fullLayout ? el._fullLayout.width : 0;
      if (column > 0 && drawn && Math.abs(drawn - column) > 1) {
        window.Plotly.relayout(el, { width: column });
      }
    });
  }
  window.addEventListener("load", function () { fit(); setTimeout(fit, 300); setTimeout(fit, 1500); });
  window.addEventListener("resize", fit);
})();
