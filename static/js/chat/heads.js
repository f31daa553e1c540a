/* A message's head: who wrote it, its badges, the "‹ 2 / 3 ›" between the versions of a reply
 * or the branches of an edited message, and its buttons. Stop and Copy are wired here (what
 * Stop starts comes back over the socket); Regenerate, the steppers and Edit redraw messages,
 * so versions.js handles their clicks.
 */
import { el, post, urlFor } from "./page.js";
import { parts } from "./state.js";

const copyButton = window.TandemCopy.button; // static/js/copy.js

export function messageHead(data) {
  const head = el("div", { className: "message-head" }, [
    el("span", { className: "author", text: data.role === "user" ? "You" : "Tandem" }),
  ]);
  if (data.role === "user") {
    if (data.wants_image) { head.appendChild(el("span", { className: "chip", text: "with image" })); }
    // Its edits, each a branch, drawn like the versions of a reply; the branch shown is the
    // model's history.
    if ((data.branches || 1) > 1) { head.appendChild(stepper("branch", data.branch, data.branches, false)); }
    head.appendChild(el("button", { type: "button", className: "edit-message", text: "Edit" }));
    head.appendChild(copyMessageButton(data));
    return head;
  }
  if (data.status === "partial") {
    head.appendChild(el("span", {
      className: "badge badge-partial",
      title: "One part of this reply finished and another did not.",
      text: "partial",
    }));
  } else if (data.status === "failed") {
    const has = function (state) { return data.parts.some(function (p) { return p.state === state; }); };
    head.appendChild(has("failed") ? el("span", { className: "badge badge-failed", text: "failed" })
      : has("interrupted") ? el("span", { className: "badge badge-failed", text: "interrupted" })
        : el("span", { className: "badge badge-stopped", text: "stopped" }));
  }
  // The versions of a regenerated reply; the one shown is the model's history.
  if ((data.versions || 1) > 1) {
    head.appendChild(stepper("version", data.version, data.versions, data.status === "in_progress"));
  }
  if (data.status === "in_progress") {
    const stop = el("button", { type: "button", className: "stop", text: "Stop" });
    stop.addEventListener("click", function () { stopMessage(data.id, stop); });
    head.appendChild(stop);
  } else if (data.status) {
    head.appendChild(el("button", { type: "button", className: "regenerate", text: "Regenerate" }));
  }
  head.appendChild(copyMessageButton(data));
  return head;
}

function copyMessageButton(data) {
  // Copies the Markdown source: the user's words, or the shown version's text as it stands.
  const words = data.role === "user" ? "Copy your message" : "Copy the reply's text";
  return copyButton("Copy", words, function () {
    if (data.role === "user") { return data.text; }
    const text = data.parts.filter(function (p) { return p.kind === "text"; })[0];
    const live = text && parts.get(text.id);
    return live ? live.text : "";
  });
}

function stepper(kind, current, count, busy) {
  // Each step button carries the number it shows (data-to).
  const step = function (label, words, to) {
    return el("button", {
      type: "button", className: "version-step " + kind + "-step", text: label, "aria-label": words,
      "data-to": String(to), disabled: busy || to < 1 || to > count ? "" : null,
    });
  };
  const plural = kind === "branch" ? "branches" : "versions";
  const group = kind === "branch" ? "Branches from this message" : "Versions of this reply";
  return el("span", { className: "versions " + plural, role: "group", "aria-label": group }, [
    step("‹", "Previous " + kind, current - 1),
    el("span", { className: "version-label " + kind + "-label", text: current + " / " + count }),
    step("›", "Next " + kind, current + 1),
  ]);
}

function stopMessage(messageId, button) {
  button.disabled = true;
  button.textContent = "Stopping…";
  post(urlFor("stop", messageId)).then(function (response) {
    if (response.status !== 202) {
      button.disabled = false;
      button.textContent = "Stop";
    }
  }, function () { button.disabled = false; button.textContent = "Stop"; });
}
