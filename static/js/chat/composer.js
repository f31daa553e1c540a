/* The composer: Enter sends (Shift+Enter is a new line), the box grows with its text, and
 * each refusal says why under it; after a 429 or 503 the Send button counts down.
 */
import { afterTurn } from "./conversations.js";
import { awaitTurn, showOwn, turnAnswered } from "./live.js";
import {
  clearErrorNotice, composer, errorText, imageToggle, keepingScroll, post, sendButton, showNotice,
  textarea, toBottom,
} from "./page.js";
import { firstTurnSettings, showSettingErrors } from "./settings.js";
import { conversation } from "./state.js";

let sending = false;
let holdUntil = 0;
let holdTimer = null;

function holdSend(seconds) {
  holdUntil = Date.now() + seconds * 1000;
  clearInterval(holdTimer);
  const tick = function () {
    const left = Math.ceil((holdUntil - Date.now()) / 1000);
    if (left <= 0) {
      clearInterval(holdTimer);
      sendButton.disabled = sending;
      sendButton.textContent = "Send";
      return;
    }
    sendButton.disabled = true;
    sendButton.textContent = "Wait " + left + " s";
  };
  tick();
  holdTimer = setInterval(tick, 250);
}

function refused(response, body) {
  if (response.status === 422 && body && body.errors) {
    showSettingErrors(body.errors);
    document.getElementById("settings-panel").open = true;
    showNotice("error", "Check the conversation's settings: " + body.error);
  } else if (response.status === 422) {
    showNotice("error", errorText(response, body, "That message can't be sent"));
  } else if (response.status === 429) {
    const wait = parseInt(response.headers.get("Retry-After") || "5", 10) || 5;
    showNotice("busy", errorText(response, body, "The engine is busy") + " You can send again in " + wait + " s.");
    holdSend(Math.min(wait, 60));
  } else if (response.status === 503) {
    const later = parseInt(response.headers.get("Retry-After") || "5", 10) || 5;
    showNotice("busy", errorText(response, body, "The model is still loading"));
    holdSend(Math.min(later, 60));
  } else if (response.status === 403) {
    showNotice("error", "Your session has expired; reload the page and sign in again.");
  } else {
    showNotice("error", errorText(response, body, "Something went wrong"));
  }
}

function send() {
  if (sending || Date.now() < holdUntil) { return; }
  const text = textarea.value;
  if (!text.trim()) { showNotice("error", "Write a message first."); textarea.focus(); return; }
  sending = true;
  awaitTurn();
  sendButton.disabled = true;
  composer.setAttribute("aria-busy", "true");
  const body = { text: text, image: imageToggle.checked };
  const settings = firstTurnSettings();
  if (!conversation.id && settings) { body.settings = settings; } // created with them
  post(conversation.turnsUrl, body)
    .then(function (response) {
      return response.json().catch(function () { return null; }).then(function (body) {
        if (response.status !== 201) { refused(response, body); return; }
        showNotice("", "");
        textarea.value = "";
        autosize();
        afterTurn(body.conversation);
        keepingScroll(function () { [body.user, body.reply].forEach(showOwn); });
        toBottom();
      });
    })
    .catch(function () {
      showNotice("error", "Could not reach the server; check your connection and try again.");
    })
    .then(function () {
      sending = false;
      turnAnswered();
      composer.removeAttribute("aria-busy");
      if (Date.now() >= holdUntil) { sendButton.disabled = false; }
    });
}

function autosize() {
  textarea.style.height = "auto";
  textarea.style.height = Math.min(textarea.scrollHeight + 2, 240) + "px";
}

textarea.addEventListener("keydown", function (event) {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing && !event.altKey && !event.ctrlKey && !event.metaKey) {
    event.preventDefault();
    send();
  }
});
textarea.addEventListener("input", function () {
  autosize();
  clearErrorNotice();
});
composer.addEventListener("submit", function (event) { event.preventDefault(); send(); });
