/* Run page: live status over the run's WebSocket, with a polling fallback.
 *
 * The WebSocket (/ws/runs/<id>/) sends the run's snapshot on connect and on
 * every change. Phase and waiting reason are updated in place; when the
 * status changes, the page's #run section is re-fetched and swapped in, so
 * the status badge, the timeline and the tool calls change together. If the socket is down (or a message
 * was lost), /runs/<id>/status/ is polled: every 2 s without a socket,
 * every 10 s with one, not at all once the run has ended.
 * Values are shown in the page's language: the words come from #run's
 * data-labels (JSON, runs.base.labels), the indicator's titles from its
 * data-title-on / data-title-off attributes.
 * A form with data-confirm (the cancel button) asks before it is sent; the
 * listener sits on the document, so it survives the #run swap (and no
 * inline handler is needed: the Content-Security-Policy forbids them).
 */
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });
  var TERMINAL = ["completed", "failed", "cancelled"];
  var root = document.getElementById("run");
  if (!root) { return; }
  var runId = root.dataset.runId;
  var shown = root.dataset.status;      // status the rendered page shows
  var wanted = shown;                   // newest status pushed; the section is being re-fetched to show it
  var socket = null;
  var socketOpen = false;
  var refreshing = false;
  var refreshAgain = false;
  var retryDelay = 1000;
  var pollTimer = null;
  var seenSeq = -1;                     // event counter of the newest snapshot applied

  var labels = {};
  try { labels = JSON.parse(root.dataset.labels); } catch (e) { /* raw values */ }

  function el(id) { return document.getElementById(id); }

  function label(value) {
    return value && Object.prototype.hasOwnProperty.call(labels, value) ? labels[value] : value;
  }

  function setText(id, value) {
    var node = el(id);
    if (node) { node.textContent = label(value) || "\u2014"; }
  }

  function setLive(on) {
    var node = el("live-indicator");
    if (node) {
      node.classList.toggle("on", on);
      node.title = (on ? node.dataset.titleOn : node.dataset.titleOff) || (on ? "live" : "polling");
    }
  }

  function refreshSection() {
    if (refreshing) { refreshAgain = true; return; }
    refreshing = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("run");
        if (fresh) {
          root.innerHTML = fresh.innerHTML;
          root.dataset.status = fresh.dataset.status;
          shown = wanted = fresh.dataset.status;
          setLive(socketOpen);
        }
      })
      .catch(function () { window.location.reload(); })
      .then(function () {
        refreshing = false;
        if (refreshAgain) { refreshAgain = false; refreshSection(); }
      });
  }

  function apply(run) {
    if (!run || String(run.id) !== String(runId)) { return; }
    // Pushes from different processes may arrive out of order: an older state never replaces a newer one.
    if (typeof run.seq === "number") {
      if (run.seq < seenSeq) { return; }
      seenSeq = run.seq;
    }
    setText("run-phase", run.phase);
    setText("run-waiting-reason", run.waiting_reason);
    // A new status comes with the section re-rendered around it (badge, timeline and tool calls from one
    // request), never alone: the badge never says "completed" beside a call the page still shows "running".
    if (run.status !== wanted) {
      wanted = run.status;
      refreshSection();
    }
    if (TERMINAL.indexOf(run.status) >= 0) { schedulePoll(); }
  }

  function poll() {
    fetch(root.dataset.statusUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) { return response.ok ? response.json() : null; })
      .then(function (body) { if (body) { apply(body.run); } })
      .catch(function () { /* offline: try again later */ })
      .then(schedulePoll);
  }

  function schedulePoll() {
    if (pollTimer) { clearTimeout(pollTimer); pollTimer = null; }
    if (TERMINAL.indexOf(shown) >= 0 && socketOpen) { return; }
    pollTimer = setTimeout(poll, socketOpen ? 10000 : 2000);
  }

  function connect() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    try {
      socket = new WebSocket(scheme + window.location.host + root.dataset.wsUrl);
    } catch (e) {
      schedulePoll();
      return;
    }
    socket.onopen = function () { socketOpen = true; retryDelay = 1000; setLive(true); schedulePoll(); };
    socket.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (message.type === "run.update") { apply(message.run); }
    };
    socket.onclose = function () {
      socketOpen = false;
      setLive(false);
      schedulePoll();
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 30000);
    };
  }

  connect();
  schedulePoll();
})();
