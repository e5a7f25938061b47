// Auto-refresh, off unless the reader turns it on; the choice is kept in this browser.
(function () {
  "use strict";
  var box = document.getElementById("auto-refresh");
  var seconds = Number(document.body.dataset.refresh || "5");
  if (!box) { return; }
  var timer = null;
  function schedule() {
    if (timer) { clearTimeout(timer); timer = null; }
    if (box.checked) { timer = setTimeout(function () { location.reload(); }, seconds * 1000); }
  }
  try { box.checked = localStorage.getItem("celery-recovery-refresh") === "on"; } catch (e) {}
  box.addEventListener("change", function () {
    try { localStorage.setItem("celery-recovery-refresh", box.checked ? "on" : "off"); } catch (e) {}
    schedule();
  });
  schedule();
})();
