/* Versions and branches: Regenerate draws a new version of a reply, its "‹ 2 / 3 ›" shows
 * another one; Edit on a sent message resends its words as a new branch, whose "‹ 2 / 3 ›"
 * switches between them. The heads draw these buttons (heads.js); their clicks are handled
 * here, on the message list, and each answer redraws what changed.
 */
import { el, errorText, keepingScroll, list, post, showNotice, toBottom, urlFor } from "./page.js";
import { applySnapshot } from "./live.js";
import { messageOf, setMessage } from "./messages.js";

function regenerate(messageId, button) {
  button.disabled = true;
  button.textContent = "Regenerating…";
  post(urlFor("regenerate", messageId)).then(function (response) {
    return response.json().catch(function () { return null; }).then(function (body) {
      if (response.status === 202) {
        keepingScroll(function () { setMessage(body.message); });
        return;
      }
      button.disabled = false;
      button.textContent = "Regenerate";
      showNotice(response.status === 409 ? "error" : "busy", errorText(response, body, "The reply was not regenerated"));
    });
  }, function () {
    button.disabled = false;
    button.textContent = "Regenerate";
    showNotice("error", "Could not reach the server; the reply was not regenerated.");
  });
}

function showVersion(messageId, version, button) {
  button.disabled = true;
  post(urlFor("version", messageId), { version: version }).then(function (response) {
    return response.json().catch(function () { return null; }).then(function (body) {
      if (response.status === 200) { keepingScroll(function () { setMessage(body.message); }); return; }
      button.disabled = false;
      showNotice("error", errorText(response, body, "That version could not be shown"));
    });
  }, function () { button.disabled = false; });
}

function showBranch(messageId, branch, button) {
  button.disabled = true;
  post(urlFor("branch", messageId), { branch: branch }).then(function (response) {
    return response.json().catch(function () { return null; }).then(function (body) {
      if (response.status === 200) { applySnapshot(body.messages); return; }
      button.disabled = false;
      showNotice("error", errorText(response, body, "That branch could not be shown"));
    });
  }, function () { button.disabled = false; showNotice("error", "Could not reach the server."); });
}

function startEdit(data, button) {
  // The bubble becomes a box with the words to change; sending starts a new branch.
  const article = button.closest("article");
  const bubble = article.querySelector(".bubble");
  if (article.querySelector(".edit-form")) { return; }
  const box = el("textarea", { className: "edit-text", rows: "3", "aria-label": "Edit your message" });
  box.value = data.text;
  const error = el("p", { className: "inline-error edit-error", role: "status", hidden: "" });
  const submit = el("button", { type: "submit", className: "small-button", text: "Send" });
  const cancel = el("button", { type: "button", className: "small-button quiet", text: "Cancel" });
  const form = el("form", { className: "edit-form", "aria-label": "Edit your message" }, [
    box,
    el("div", { className: "edit-actions" }, [
      el("span", { className: "muted small", text: "Sends it as a new branch; this one is kept." }),
      cancel,
      submit,
    ]),
    error,
  ]);
  const end = function () { form.remove(); bubble.hidden = false; button.hidden = false; button.focus(); };
  bubble.hidden = true;
  button.hidden = true;
  bubble.after(form);
  cancel.addEventListener("click", end);
  box.addEventListener("keydown", function (event) {
    if (event.key === "Escape") { event.preventDefault(); event.stopPropagation(); end(); }
    else if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    sendEdit(data.id, box, submit, error);
  });
  box.focus();
}

function sendEdit(messageId, box, button, error) {
  const fail = function (words) {
    button.disabled = false;
    button.textContent = "Send";
    error.hidden = false;
    error.textContent = words;
    box.setAttribute("aria-invalid", "true");
  };
  if (!box.value.trim()) { fail("Write a message first."); return; }
  button.disabled = true;
  button.textContent = "Sending…";
  post(urlFor("edit", messageId), { text: box.value }).then(function (response) {
    return response.json().catch(function () { return null; }).then(function (body) {
      if (response.status === 201) { applySnapshot(body.messages); toBottom(); return; }
      fail(errorText(response, body, "The edit was not sent"));
    });
  }, function () { fail("Could not reach the server; the edit was not sent."); });
}

// A branch's steps are also .version-step (one look for both): test for a branch first.
list.addEventListener("click", function (event) {
  const button = event.target.closest("button.regenerate, button.version-step, button.branch-step, button.edit-message");
  if (!button) { return; }
  const data = messageOf(button);
  if (button.classList.contains("regenerate")) { regenerate(data.id, button); }
  else if (button.classList.contains("branch-step")) { showBranch(data.id, Number(button.dataset.to), button); }
  else if (button.classList.contains("version-step")) { showVersion(data.id, Number(button.dataset.to), button); }
  else { startEdit(data, button); }
});
