/* The API keys page: the answer to "Create key" shows the new token once. Replacing the
 * history entry makes a reload (or Back, Forward) fetch the page with GET, so it neither
 * posts the form again, making a second key, nor shows the token again.
 */
(function () {
  "use strict";
  if (document.getElementById("new-key-token")) {
    history.replaceState(null, "", window.location.href);
  }
})();
