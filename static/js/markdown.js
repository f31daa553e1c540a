/* Tandem's safe Markdown renderer: window.TandemMarkdown.render(text) -> HTML.
 *
 * Hand-written, no build step; loaded before chat.js. Everything is escaped first; the
 * Markdown pass only ever adds a fixed set of tags (p, br, strong, em, code, pre, ul, ol,
 * li, h3-h6, hr, a with an http(s) href), so neither a user nor the model can inject markup.
 */
(function () {
  "use strict";

  var ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, function (c) { return ESCAPES[c]; });
  }

  function emphasis(html) {
    // Runs on escaped text: the only tags it can add are <strong> and <em>.
    return html
      .replace(/\*\*(?=\S)([^\n]*?\S)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^\w])__(?=\S)([^\n]*?\S)__(?!\w)/g, "$1<strong>$2</strong>")
      .replace(/(^|[^*\w])\*([^\s*<](?:[^*<\n]*?[^\s*<])?)\*(?![*\w])/g, "$1<em>$2</em>")
      .replace(/(^|[^_\w])_([^\s_<](?:[^_<\n]*?[^\s_<])?)_(?![_\w])/g, "$1<em>$2</em>");
  }

  function link(url, labelHtml) {
    return '<a href="' + url + '" rel="noopener noreferrer" target="_blank">' + labelHtml + "</a>";
  }

  // A URL inside escaped text: it stops at whitespace, at "<" and at an escaped quote or bracket.
  var URL_CHARS = "(?:(?!&(?:quot|lt|gt|#39);)[^\\s<\\u0000])";
  var MD_LINK = new RegExp("\\[([^\\]\\n]+)\\]\\((https?:\\/\\/" + URL_CHARS + "+?)\\)", "g");
  var BARE_URL = new RegExp("\\bhttps?:\\/\\/" + URL_CHARS + "+", "g");

  function inline(escaped) {
    var slots = [];
    function keep(html) { return "\u0000" + (slots.push(html) - 1) + "\u0000"; }
    var html = escaped
      .replace(/`([^`\n]+)`/g, function (m, code) { return keep("<code>" + code + "</code>"); })
      .replace(MD_LINK, function (m, label, url) { return keep(link(url, emphasis(label))); })
      .replace(BARE_URL, function (url) {
        var trail = url.match(/[.,;:!?)\]]+$/);
        var tail = trail ? trail[0] : "";
        url = url.slice(0, url.length - tail.length);
        return keep(link(url, url)) + tail;
      });
    html = emphasis(html);
    return html.replace(/\u0000(\d+)\u0000/g, function (m, n) { return slots[Number(n)]; });
  }

  function inlineLines(lines) {
    return lines.map(function (line) { return inline(escapeHtml(line)); }).join("<br>");
  }

  var FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)\s*$/;
  var ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  var HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  var RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;

  function renderMarkdown(source) {
    var lines = String(source == null ? "" : source)
      .replace(/\u0000/g, "")
      .replace(/\r\n?/g, "\n")
      .split("\n");
    var out = [];
    var para = [];
    var i = 0;
    function flush() {
      if (para.length) { out.push("<p>" + inlineLines(para) + "</p>"); para = []; }
    }
    while (i < lines.length) {
      var line = lines[i];
      var fence = line.match(FENCE);
      if (fence) {
        flush();
        var marker = fence[1];
        var closing = new RegExp("^\\s{0,3}" + (marker[0] === "`" ? "`" : "~") + "{" + marker.length + ",}\\s*$");
        var body = [];
        i += 1;
        while (i < lines.length && !closing.test(lines[i])) { body.push(lines[i]); i += 1; }
        i += 1; // the closing fence (an unclosed one, mid-stream, runs to the end)
        var lang = fence[2] ? ' data-lang="' + escapeHtml(fence[2]) + '"' : "";
        out.push("<pre><code" + lang + ">" + escapeHtml(body.join("\n")) + "</code></pre>");
        continue;
      }
      if (/^\s*$/.test(line)) { flush(); i += 1; continue; }
      if (RULE.test(line)) { flush(); out.push("<hr>"); i += 1; continue; }
      var heading = line.match(HEADING);
      if (heading) {
        flush();
        var level = Math.min(heading[1].length + 2, 6);
        out.push("<h" + level + ">" + inline(escapeHtml(heading[2])) + "</h" + level + ">");
        i += 1;
        continue;
      }
      var item = line.match(ITEM);
      if (item) {
        flush();
        var ordered = /\d/.test(item[2]);
        var items = [];
        while (i < lines.length) {
          var m = lines[i].match(ITEM);
          if (m && /\d/.test(m[2]) === ordered) { items.push([m[3]]); i += 1; continue; }
          if (!m && items.length && /^\s{2,}\S/.test(lines[i])) {
            items[items.length - 1].push(lines[i].trim()); i += 1; continue;
          }
          break;
        }
        var start = ordered ? parseInt(item[2], 10) : 1;
        var open = ordered ? (start !== 1 ? '<ol start="' + start + '">' : "<ol>") : "<ul>";
        out.push(open + items.map(function (parts) {
          return "<li>" + inlineLines(parts) + "</li>";
        }).join("") + (ordered ? "</ol>" : "</ul>"));
        continue;
      }
      para.push(line);
      i += 1;
    }
    flush();
    return out.join("");
  }

  window.TandemMarkdown = { render: renderMarkdown, escape: escapeHtml };
})();
