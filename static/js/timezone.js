/* Tell the server the browser's time zone, so pages show times in it.
 *
 * Stores the IANA zone name the browser reports (e.g. "Asia/Shanghai") in
 * the tollgate_tz cookie for a year; config.middleware.BrowserTimeZoneMiddleware
 * accepts only known zone names and falls back to UTC. Pages rendered
 * before the cookie existed say which zone they used (the footer); the
 * next page uses the browser's.
 */
(function () {
  "use strict";
  var zone;
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone; } catch (e) { return; }
  if (!zone || !/^[A-Za-z0-9_+\-\/]{1,64}$/.test(zone)) { return; }
  var current = document.cookie.match(/(?:^|;\s*)tollgate_tz=([^;]*)/);
  if (current && current[1] === zone) { return; }
  document.cookie = "tollgate_tz=" + zone + "; path=/; max-age=31536000; SameSite=Lax" +
    (window.location.protocol === "https:" ? "; Secure" : "");
})();
