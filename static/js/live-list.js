/* Live lists: the inbox and the run list follow run changes (WebSocket /ws/runs/).
 *
 * The inbox ([data-live-list][data-rows-url]) patches rows: on run.update
 * messages it asks the rows endpoint for the pending items of just those
 * runs (with the page's own sort and filters), removes their old rows and
 * inserts the new ones where the page's order puts them (rows carry their
 * order key in data-k1/data-k2), then swaps in the fresh navigation counts
 * and page title. A row that sorts outside this page's range is left to
 * the page it belongs to. Every 60 s the rows on the page are fetched
 * again the same way (ages and urgency move on).
 *
 * Other lists ([data-live-list] alone) fetch the whole page and swap the
 * section in, on changes and every 15 s. After a lost socket both reload
 * the section once, since events may have been missed.
 */
(function () {
  "use strict";
  var section = document.querySelector("[data-live-list]");
  if (!section) { return; }
  var rowsUrl = section.getAttribute("data-rows-url");
  var changed = {};
  var pending = null;
  var retryDelay = 1000;
  var FILTERS = ["sort", "kind", "tool", "agent", "requester", "q"];

  function refreshSection() {
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var page = new DOMParser().parseFromString(html, "text/html");
        var fresh = page.getElementById(section.id);
        if (fresh) { section.innerHTML = fresh.innerHTML; }
        var counts = page.getElementById("inbox-counts");
        if (counts) { replaceCounts(counts); }
      })
      .catch(function () { /* try again on the next tick */ });
  }

  function key(row) {
    return [Number(row.getAttribute("data-k1")), Number(row.getAttribute("data-k2"))];
  }

  function before(a, b) {
    return a[0] < b[0] || (a[0] === b[0] && a[1] < b[1]);
  }

  function replaceCounts(fresh) {
    var current = document.getElementById("inbox-counts");
    if (current) { current.replaceWith(document.importNode(fresh, true)); }
    var total = fresh.getAttribute("data-total");
    var base = section.getAttribute("data-title");
    if (base) { document.title = base + (total && total !== "0" ? " (" + total + ")" : "") + " · Tollgate"; }
  }

  function place(body, row) {
    var rows = body.querySelectorAll("tr.inbox-item");
    var mine = key(row);
    var firstPage = !new URLSearchParams(window.location.search).get("after");
    var lastPage = section.getAttribute("data-last-page") === "true";
    if (rows.length && !firstPage && before(mine, key(rows[0]))) { return; }  // belongs to an earlier page
    if (rows.length && !lastPage && before(key(rows[rows.length - 1]), mine)) { return; }  // to a later page
    if (!rows.length && !firstPage && !lastPage) { return; }
    for (var i = 0; i < rows.length; i++) {
      if (before(mine, key(rows[i]))) { body.insertBefore(row, rows[i]); return; }
    }
    body.appendChild(row);
  }

  function patchRows(runIds) {
    var query = new URLSearchParams();
    var here = new URLSearchParams(window.location.search);
    FILTERS.forEach(function (name) { if (here.get(name)) { query.set(name, here.get(name)); } });
    runIds.forEach(function (id) { query.append("run", id); });
    fetch(rowsUrl + "?" + query.toString(), { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var fragment = new DOMParser().parseFromString(html, "text/html");
        var body = document.getElementById("inbox-rows");
        runIds.forEach(function (id) {
          body.querySelectorAll('tr.inbox-item[data-run-id="' + id + '"]').forEach(function (row) { row.remove(); });
        });
        fragment.querySelectorAll("tr.inbox-item").forEach(function (row) {
          place(body, document.importNode(row, true));
        });
        document.getElementById("inbox-empty").hidden = body.querySelector("tr.inbox-item") !== null;
        var counts = fragment.getElementById("inbox-counts");
        if (counts) { replaceCounts(counts); }
      })
      .catch(function () { /* the next change or tick tries again */ });
  }

  function flush() {
    pending = null;
    var ids = Object.keys(changed);
    changed = {};
    for (var start = 0; start < ids.length; start += 100) { patchRows(ids.slice(start, start + 100)); }
  }

  function onMessage(event) {
    if (!rowsUrl) {
      if (!pending) { pending = setTimeout(function () { pending = null; refreshSection(); }, 300); }
      return;
    }
    var message;
    try { message = JSON.parse(event.data); } catch (e) { return; }
    if (!message || message.type !== "run.update" || !message.run) { return; }
    changed[String(message.run.id)] = true;
    if (!pending) { pending = setTimeout(flush, 200); }
  }

  function onTick() {
    if (!rowsUrl) { refreshSection(); return; }
    section.querySelectorAll("tr.inbox-item").forEach(function (row) {
      changed[row.getAttribute("data-run-id")] = true;
    });
    flush();
  }

  var lost = false;
  function connect() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + window.location.host + "/ws/runs/");
    socket.onopen = function () {
      retryDelay = 1000;
      section.setAttribute("data-live", "on");
      if (lost) { lost = false; refreshSection(); }
    };
    socket.onmessage = onMessage;
    socket.onclose = function () {
      lost = true;
      section.setAttribute("data-live", "off");
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 30000);
    };
  }

  connect();
  setInterval(onTick, rowsUrl ? 60000 : 15000);
})();
