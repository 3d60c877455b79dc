// Opened from disk (file://), a browser does not let the page fetch the search index, and
// Material then hides its search box without a word. Show the box instead, disabled, saying why.
(function () {
  if (location.protocol !== "file:") return;
  var why = "Search needs the site served (make serve): a page opened from disk cannot fetch the search index.";
  function explain() {
    var input = document.querySelector("input.md-search__input");
    if (!input) return;
    var search = input.closest(".md-search");
    if (search) search.hidden = false; // Material hid it when its search worker failed to start
    input.disabled = true;
    input.placeholder = "Search: make serve"; // short enough for the header's box; the title says more
    input.title = why;
    var meta = document.querySelector(".md-search-result__meta"); // on a phone, under the box
    if (meta) meta.textContent = why; // instead of "Initializing search", forever
  }
  // After Material's own DOMContentLoaded handler, which registered first and hides the box.
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", explain);
  else explain();
})();
