/* Inbox item page: when someone else decides the item, swap the form for who decided it.
 *
 * While the item is pending, the page listens on its run's WebSocket
 * (/ws/runs/<id>/), which sends the run's snapshot on connect and again
 * whenever the run or one of its inbox items changes. Each message makes
 * the page fetch the item's small state fragment (#item's data-state-url,
 * approvals.web.views.interrupt_state); once that says the item is no longer
 * pending, the fragment ("decided by X at T: comment", with the changed
 * arguments) takes the place of the form, the status badge follows and
 * the socket is closed. A lost socket reconnects with a growing delay; the
 * snapshot sent on connect catches up on anything missed meanwhile.
 * Status words come from #item's data-labels (runs.base.labels).
 */
(function () {
  "use strict";
  var root = document.getElementById("item");
  if (!root || root.dataset.status !== "pending") { return; }
  var labels = {};
  try { labels = JSON.parse(root.dataset.labels); } catch (e) { /* raw values */ }
  var socket = null;
  var done = false;
  var fetching = false;
  var fetchAgain = false;
  var retryDelay = 1000;

  function removeById(id) {
    var node = document.getElementById(id);
    if (node) { node.parentNode.removeChild(node); }
  }

  function show(fresh) {
    var status = fresh.dataset.status;
    var old = document.getElementById("item-state");
    var form = document.getElementById("decision") || document.getElementById("cannot-decide");
    var node = document.importNode(fresh, true);
    if (form) {
      form.parentNode.replaceChild(node, form);
      if (old) { old.parentNode.removeChild(old); }
    } else if (old) {
      old.parentNode.replaceChild(node, old);
    }
    removeById("item-expiry");
    var badge = document.getElementById("item-status");
    if (badge) {
      badge.textContent = Object.prototype.hasOwnProperty.call(labels, status) ? labels[status] : status;
      badge.dataset.status = status;
      badge.className = "badge status-" + status;
    }
    root.dataset.status = status;
    done = true;
    if (socket) { socket.close(); }
  }

  function refresh() {
    if (done) { return; }
    if (fetching) { fetchAgain = true; return; }
    fetching = true;
    fetch(root.dataset.stateUrl, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("item-state");
        if (fresh && fresh.dataset.status !== "pending") { show(fresh); }
      })
      .catch(function () { /* offline: the next message or reconnect tries again */ })
      .then(function () {
        fetching = false;
        if (fetchAgain) { fetchAgain = false; refresh(); }
      });
  }

  function connect() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    try {
      socket = new WebSocket(scheme + window.location.host + root.dataset.wsUrl);
    } catch (e) {
      return;
    }
    socket.onopen = function () { retryDelay = 1000; };
    socket.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (message.type === "run.update") { refresh(); }
    };
    socket.onclose = function () {
      if (done) { return; }
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 30000);
    };
  }

  connect();
})();
