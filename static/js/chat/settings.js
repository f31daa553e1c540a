/* The conversation's Settings panel: system prompt, temperature, top-p, max new tokens and the
 * Image switch's default. Saved to the server, or, before the conversation exists, kept in the
 * page and sent with its first message; an open page follows changes made elsewhere.
 */
import { errorText, imageToggle, post, urlFor } from "./page.js";
import { conversation } from "./state.js";

const settingsForm = document.getElementById("settings-form");
const settingsNotice = document.getElementById("settings-notice");
const SETTING_NAMES = ["system_prompt", "temperature", "top_p", "max_new_tokens", "image_by_default"];
let pendingSettings = null; // saved before the conversation exists: sent with its first message

// What the first message sends along (null when nothing was saved before it).
export function firstTurnSettings() { return pendingSettings; }

function settingsValues() {
  const values = {};
  SETTING_NAMES.forEach(function (name) {
    const field = settingsForm.elements[name];
    values[name] = field.type === "checkbox" ? field.checked : field.value;
  });
  return values;
}

export function showSettings(values) {
  if (!values) { return; }
  SETTING_NAMES.forEach(function (name) {
    const field = settingsForm.elements[name];
    if (field === document.activeElement) { return; } // not under the user's cursor
    if (field.type === "checkbox") { field.checked = !!values[name]; }
    else { field.value = String(values[name]); }
  });
}

export function showSettingErrors(errors) {
  settingsForm.querySelectorAll(".field-error").forEach(function (node) {
    const words = errors && errors[node.dataset.for];
    node.hidden = !words;
    node.textContent = words || "";
    const field = settingsForm.elements[node.dataset.for];
    if (words) { field.setAttribute("aria-invalid", "true"); } else { field.removeAttribute("aria-invalid"); }
  });
}

function saveSettings() {
  showSettingErrors(null);
  if (!conversation.id) {
    // No conversation yet: these go with the first message, checked there.
    pendingSettings = settingsValues();
    imageToggle.checked = pendingSettings.image_by_default;
    settingsNotice.textContent = "Kept: they apply from the first message.";
    return;
  }
  settingsNotice.textContent = "Saving…";
  post(urlFor("settings", conversation.id), settingsValues()).then(function (response) {
    return response.json().catch(function () { return null; }).then(function (body) {
      if (response.status === 200) {
        const saved = body.conversation.settings;
        showSettings(saved);
        imageToggle.checked = saved.image_by_default;
        settingsNotice.textContent = "Saved: the next reply uses them.";
        return;
      }
      showSettingErrors(body && body.errors);
      settingsNotice.textContent = errorText(response, body, "Not saved");
    });
  }, function () { settingsNotice.textContent = "Could not reach the server; not saved."; });
}

settingsForm.addEventListener("submit", function (event) { event.preventDefault(); saveSettings(); });
