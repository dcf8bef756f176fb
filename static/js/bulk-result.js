/* Bulk result page: the table of what became of the decided items is
 * re-fetched (#bulk-outcomes' data-url) every 2 s until every row has
 * settled (data-settled="true"), then left alone. A failed request is
 * tried again at the next tick.
 */
(function () {
  "use strict";
  var section = document.getElementById("bulk-outcomes");
  if (!section) { return; }

  function unsettled() {
    return section.querySelector('.bulk-outcome[data-settled="false"]') !== null;
  }

  function refresh() {
    fetch(section.dataset.url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html === null) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("bulk-outcome-table");
        var table = document.getElementById("bulk-outcome-table");
        if (fresh && table) { table.replaceWith(fresh); }
      })
      .catch(function () { /* offline: the next tick tries again */ })
      .then(function () { if (unsettled()) { setTimeout(refresh, 2000); } });
  }

  if (unsettled()) { setTimeout(refresh, 2000); }
}());
