/* Keyboard shortcuts on the conversation page: Esc stops the reply streaming in it.
 *
 * Only when no other Esc handler took the key (the rename box, an open settings panel) and a
 * reply here still has its Stop button; it presses that button, so the request is the same.
 */

const list = document.getElementById("messages");

if (list) {
  document.addEventListener("keydown", function (event) {
    if (event.key !== "Escape" || event.defaultPrevented || event.isComposing) { return; }
    const settings = document.getElementById("settings-panel");
    if (settings && settings.open) { settings.open = false; return; }
    const stops = list.querySelectorAll("button.stop:not(:disabled)");
    if (!stops.length) { return; }
    event.preventDefault();
    stops[stops.length - 1].click();
  });
}
