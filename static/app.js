// The dashboard's only script (CSP forbids inline script): lease countdowns, "select all"
// on the queue and dead-letters pages, and no auto-refresh of those tables while a
// selection is made.
(function () {
  "use strict";

  function fmt(seconds) {
    var s = Math.max(0, Math.round(Math.abs(seconds)));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  }

  function stamp(root) {
    var now = Date.now();
    root.querySelectorAll("[data-seconds-left]:not([data-deadline])").forEach(function (el) {
      el.dataset.deadline = now + parseFloat(el.dataset.secondsLeft) * 1000;
    });
    root.querySelectorAll("[data-seconds-ago]:not([data-since])").forEach(function (el) {
      el.dataset.since = now - parseFloat(el.dataset.secondsAgo) * 1000;
    });
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-deadline]").forEach(function (el) {
      var left = (parseFloat(el.dataset.deadline) - now) / 1000;
      el.textContent = left > 0 ? fmt(left) : "lapsed " + fmt(left) + " ago";
      el.classList.toggle("lapsed", left <= 0);
      el.classList.toggle("soon", left > 0 && left < 10);
    });
    document.querySelectorAll("[data-since]").forEach(function (el) {
      el.textContent = fmt((now - parseFloat(el.dataset.since)) / 1000);
    });
  }

  document.addEventListener("DOMContentLoaded", function () { stamp(document); });
  document.addEventListener("htmx:afterSwap", function (e) { var swapped = e.detail.target || e.target;
    stamp((swapped && swapped.parentNode) || document); });
  setInterval(tick, 1000);

  document.addEventListener("change", function (e) {
    if (e.target.id === "select-all" || e.target.classList.contains("select-all")) {
      var form = e.target.closest("form") || document;
      form.querySelectorAll("input[name=ids]").forEach(function (box) {
        box.checked = e.target.checked;
      });
    }
  });

  // Keep an operator's selection: skip a table's polling while boxes are ticked.
  document.addEventListener("htmx:beforeRequest", function (e) {
    var elt = e.detail.elt;
    if (elt && (elt.id === "dead" || elt.id === "todos") && e.detail.requestConfig.verb === "get" &&
        elt.querySelector("input[name=ids]:checked")) {
      e.preventDefault();
    }
  });
})();
