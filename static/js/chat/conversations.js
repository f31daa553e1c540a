/* The conversation as a whole: its title (in the header, the list and the tab), the page
 * becoming a conversation's page when its first message creates it, Rename, Delete, and
 * being deleted here or in another tab.
 */
import { disconnect, connect } from "./connection.js";
import { el, errorText, post, root, sendButton, showNotice, textarea, urlFor } from "./page.js";
import { conversation } from "./state.js";

const titleNode = document.getElementById("conversation-title");
const actions = document.getElementById("chat-actions");
const renameForm = document.getElementById("rename-form");
const renameInput = document.getElementById("rename-input");
const renameError = document.getElementById("rename-error");
const deleteButton = document.getElementById("delete");
const deleteConfirm = document.getElementById("delete-confirm");
const deleteYes = document.getElementById("delete-yes");
const deleteNo = document.getElementById("delete-no");

function currentLink() {
  return document.querySelector('.conversation-list a[aria-current="page"]');
}

export function showTitle(title) {
  titleNode.textContent = title;
  titleNode.dataset.untitled = "false";
  const link = currentLink();
  if (link) { link.textContent = title; link.dataset.untitled = "false"; }
  document.title = title + " · Tandem";
}

function becomeConversation(created) {
  // The first message created the conversation: this page is now its page.
  conversation.id = created.id;
  conversation.turnsUrl = created.turns_url;
  root.dataset.conversationId = String(created.id);
  history.replaceState(null, "", created.url);
  const nav = document.querySelector(".conversation-list");
  const ul = nav.querySelector("ul") || nav.appendChild(el("ul"));
  const empty = nav.querySelector(".empty-list");
  if (empty) { empty.remove(); }
  ul.insertBefore(el("li", {}, [el("a", {
    href: created.url,
    "data-conversation-id": created.id,
    "data-untitled": "false",
    "aria-current": "page",
    text: created.title,
  })]), ul.firstChild);
  showTitle(created.title);
  document.getElementById("export-md").href = urlFor("export", created.id);
  document.getElementById("export-json").href = urlFor("export", created.id).replace(/\.md$/, ".json");
  actions.hidden = false;
  connect();
}

// A turn's answer names its conversation: the first turn creates it, a later one may title it.
export function afterTurn(answer) {
  if (!conversation.id) { becomeConversation(answer); }
  else if (titleNode.dataset.untitled === "true") { showTitle(answer.title); }
}

// -------------------------------------------------------------- rename

function startRename() {
  renameInput.value = titleNode.textContent;
  renameError.hidden = true;
  titleNode.hidden = true;
  actions.hidden = true;
  renameForm.hidden = false;
  renameInput.focus();
  renameInput.select();
}

function endRename() {
  renameForm.hidden = true;
  titleNode.hidden = false;
  actions.hidden = false;
  renameInput.removeAttribute("aria-invalid");
}

function saveRename() {
  const button = renameForm.querySelector("button[type=submit]");
  button.disabled = true;
  post(urlFor("rename", conversation.id), { title: renameInput.value })
    .then(function (response) {
      return response.json().catch(function () { return null; }).then(function (body) {
        if (response.status === 200) { showTitle(body.conversation.title); endRename(); return; }
        renameError.hidden = false;
        renameError.textContent = (body && body.errors && body.errors.title) || errorText(response, body, "The title was not saved");
        renameInput.setAttribute("aria-invalid", "true");
      });
    }, function () {
      renameError.hidden = false;
      renameError.textContent = "Could not reach the server.";
    })
    .then(function () { button.disabled = false; });
}

document.getElementById("rename").addEventListener("click", startRename);
document.getElementById("rename-cancel").addEventListener("click", endRename);
renameForm.addEventListener("submit", function (event) { event.preventDefault(); saveRename(); });
renameInput.addEventListener("keydown", function (event) {
  if (event.key === "Escape") { event.preventDefault(); endRename(); }
});

// -------------------------------------------------------------- delete

deleteButton.addEventListener("click", function () {
  deleteButton.hidden = true;
  deleteConfirm.hidden = false;
  deleteNo.focus();
});
deleteNo.addEventListener("click", function () {
  deleteConfirm.hidden = true;
  deleteButton.hidden = false;
});
deleteYes.addEventListener("click", function () {
  deleteYes.disabled = true;
  post(urlFor("delete", conversation.id)).then(function (response) {
    return response.json().catch(function () { return null; }).then(function (body) {
      if (response.status === 200) { conversation.deleted = true; location.assign(body.redirect); return; }
      deleteYes.disabled = false;
      showNotice("error", errorText(response, body, "The conversation was not deleted"));
    });
  }, function () {
    deleteYes.disabled = false;
    showNotice("error", "Could not reach the server; the conversation was not deleted.");
  });
});

export function onDeleted() {
  // Deleted here or in another tab: nothing more will come, and nothing can be sent.
  conversation.deleted = true;
  disconnect("this conversation was deleted");
  actions.hidden = true;
  sendButton.disabled = true;
  textarea.disabled = true;
  showNotice("error", "This conversation was deleted.");
}
