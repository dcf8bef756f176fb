/* Inbox and run list: refresh the [data-live-list] section when any
 * visible run changes (WebSocket /ws/runs/), and every 15 s regardless,
 * by fetching the page and swapping the section in.
 */
(function () {
  "use strict";
  var section = document.querySelector("[data-live-list]");
  if (!section) { return; }
  var pending = null;
  var retryDelay = 1000;

  function refresh() {
    pending = null;
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById(section.id);
        if (fresh) { section.innerHTML = fresh.innerHTML; }
      })
      .catch(function () { /* try again on the next tick */ });
  }

  function soon() {
    if (!pending) { pending = setTimeout(refresh, 300); }
  }

  function connect() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var socket = new WebSocket(scheme + window.location.host + "/ws/runs/");
    socket.onopen = function () { retryDelay = 1000; };
    socket.onmessage = soon;
    socket.onclose = function () {
      setTimeout(connect, retryDelay);
      retryDelay = Math.min(retryDelay * 2, 30000);
    };
  }

  connect();
  setInterval(refresh, 15000);
})();
