/* Copy buttons: window.TandemCopy.button(label, describe, getText) makes one; a click on a
 * code block's .copy-code (drawn by markdown.js) copies that block's code.
 *
 * The Clipboard API needs a secure context (https or localhost); on plain http elsewhere the
 * text goes through a hidden textarea and execCommand("copy") instead.
 */
(function () {
  "use strict";

  function viaTextarea(text) {
    var box = document.createElement("textarea");
    box.value = text;
    box.setAttribute("readonly", "");
    box.className = "visually-hidden";
    document.body.appendChild(box);
    box.select();
    var done = false;
    try { done = document.execCommand("copy"); } catch (e) { done = false; }
    box.remove();
    return done ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  function copy(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).catch(function () { return viaTextarea(text); });
    }
    return viaTextarea(text);
  }

  function copyFrom(button, text) {
    var label = button.dataset.label || button.textContent;
    button.dataset.label = label;
    copy(text).then(function () { button.textContent = "Copied"; }, function () { button.textContent = "Copy failed"; })
      .then(function () {
        clearTimeout(button.copyTimer);
        button.copyTimer = setTimeout(function () { button.textContent = label; }, 1500);
      });
  }

  function button(label, describe, getText) {
    var node = document.createElement("button");
    node.type = "button";
    node.className = "copy-message";
    node.textContent = label;
    node.setAttribute("aria-label", describe);
    node.addEventListener("click", function () { copyFrom(node, getText() || ""); });
    return node;
  }

  document.addEventListener("click", function (event) {
    var target = event.target.closest && event.target.closest(".copy-code");
    if (!target) { return; }
    var code = target.closest(".code-block").querySelector("pre code");
    copyFrom(target, code ? code.textContent : "");
  });

  window.TandemCopy = { copy: copy, button: button };
})();
