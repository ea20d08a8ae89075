// lanes dashboard: live updates. The server sends an event when instances
// or the policy change or a finding arrives; the page fetches itself again
// and swaps in its live parts ([data-live]), keeping forms being edited.
(function () {
  "use strict";
  if (!document.querySelector("[data-live-page]") || !window.EventSource) return;
  var status = document.getElementById("live-status");
  var pending = false, busy = false;
  function refresh() {
    if (busy) { pending = true; return; }
    busy = true;
    fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (el) {
          var fresh = doc.querySelector('[data-live="' + el.getAttribute("data-live") + '"]');
          if (fresh && fresh.innerHTML !== el.innerHTML) el.innerHTML = fresh.innerHTML;
        });
        var rev = document.querySelector("[data-revision]"), nrev = doc.querySelector("[data-revision]");
        if (rev && nrev) rev.textContent = nrev.textContent;
        document.body.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () {})
      .then(function () { busy = false; if (pending) { pending = false; refresh(); } });
  }
  var es = new EventSource("/ui/events");
  ["instances", "policy", "findings"].forEach(function (kind) {
    es.addEventListener(kind, function () {
      if (status) status.textContent = "Updated: " + kind + " changed";
      refresh();
    });
  });
  // The stream opens once the server follows the current state; what
  // changed since this page was drawn (or while the stream was down) shows
  // by one refresh.
  es.onopen = function () {
    refresh();
    document.body.setAttribute("data-live-connected", "true");
  };
})();
