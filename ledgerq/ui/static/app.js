// ledgerq ui: progressive enhancement only. Every page works without this script; it
// refreshes the live parts in place, counts filter matches, and helps with selections.
"use strict";

(function () {
  // Refresh each [data-live][data-refresh=N] region every N seconds by fetching the same
  // page and swapping in the region of the same name - unless the person is typing in
  // it, or the tab is hidden.
  function refreshLive() {
    const regions = document.querySelectorAll("[data-live][data-refresh]");
    regions.forEach(function (region) {
      const seconds = parseFloat(region.getAttribute("data-refresh"));
      if (!(seconds > 0)) return;
      const name = region.getAttribute("data-live");
      window.setInterval(function () {
        if (document.hidden) return;
        if (region.contains(document.activeElement) && document.activeElement !== document.body) return;
        fetch(window.location.href, { credentials: "same-origin", headers: { "X-Live": name } })
          .then(function (response) { return response.ok ? response.text() : null; })
          .then(function (html) {
            if (!html) return;
            const fresh = new DOMParser().parseFromString(html, "text/html");
            const replacement = fresh.querySelector('[data-live="' + name + '"]');
            if (replacement) region.innerHTML = replacement.innerHTML;
            if (replacement && !replacement.hasAttribute("data-refresh")) region.removeAttribute("data-refresh");
          })
          .catch(function () { /* the console is restarting: try again next time */ });
      }, seconds * 1000);
    });
  }

  // Fill [data-count-url] with the number of matches (the server counts them all).
  function countMatches() {
    document.querySelectorAll("[data-count-url]").forEach(function (el) {
      fetch(el.getAttribute("data-count-url"), { credentials: "same-origin" })
        .then(function (response) { return response.ok ? response.json() : null; })
        .then(function (data) {
          if (data && typeof data.matching === "number") {
            el.textContent = data.matching.toLocaleString("en-US") + (data.matching === 1 ? " dead letter" : " dead letters");
          }
        })
        .catch(function () {});
    });
  }

  // The "select all" box, and buttons that act on a selection only when there is one.
  function selections() {
    document.querySelectorAll("form").forEach(function (form) {
      const all = form.querySelector("[data-select-all]");
      const boxes = Array.prototype.slice.call(form.querySelectorAll('input[type=checkbox][name=id]'));
      const needers = form.querySelectorAll("[data-needs-selection]");
      if (!boxes.length && !needers.length) return;
      function update() {
        const picked = boxes.filter(function (b) { return b.checked; }).length;
        needers.forEach(function (button) {
          button.disabled = picked === 0;
          const base = button.getAttribute("data-label") || button.textContent;
          button.setAttribute("data-label", base);
          button.textContent = picked ? base.replace("selected", picked + " selected") : base;
        });
        if (all) {
          all.checked = picked > 0 && picked === boxes.length;
          all.indeterminate = picked > 0 && picked < boxes.length;
        }
      }
      if (all) {
        all.addEventListener("change", function () {
          boxes.forEach(function (b) { b.checked = all.checked; });
          update();
        });
      }
      boxes.forEach(function (b) { b.addEventListener("change", update); });
      update();
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    refreshLive();
    countMatches();
    selections();
  });
})();
