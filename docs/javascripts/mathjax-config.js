// MathJax 3 for pymdownx.arithmatex (generic mode): typeset only the arithmatex spans.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
};

// The first page is typeset by MathJax's own startup; clearing its output cache then would drop
// the fonts' CSS. Only the pages that mkdocs-material's instant navigation swaps in afterwards
// are typeset here.
if (typeof document$ !== "undefined") {
  let first = true;
  document$.subscribe(() => {
    if (first) {
      first = false;
      return;
    }
    MathJax.startup.output.clearCache();
    MathJax.typesetClear();
    MathJax.texReset();
    MathJax.typesetPromise();
  });
}
