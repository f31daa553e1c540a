/* The narrow layout: below 760 px the conversation list hides behind the top bar's
 * "Conversations" button, which opens it over the page; Esc or a click outside closes it.
 */

const toggle = document.getElementById("sidebar-toggle");
const sidebar = document.getElementById("sidebar");

function setOpen(open) {
  toggle.setAttribute("aria-expanded", open ? "true" : "false");
  document.body.classList.toggle("sidebar-open", open);
}

if (toggle && sidebar) {
  toggle.addEventListener("click", function () {
    const open = toggle.getAttribute("aria-expanded") !== "true";
    setOpen(open);
    if (open) { (sidebar.querySelector("a, input, button") || sidebar).focus(); }
  });
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && document.body.classList.contains("sidebar-open")) {
      event.preventDefault(); // handled here: shortcuts.js leaves a streaming reply alone
      setOpen(false);
      toggle.focus();
    }
  });
  document.addEventListener("click", function (event) {
    if (document.body.classList.contains("sidebar-open") && !sidebar.contains(event.target) && !toggle.contains(event.target)) {
      setOpen(false);
    }
  });
}
