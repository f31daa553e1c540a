"""The page's Markdown renderer, run in Chromium: a small subset, and nothing else gets through."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

MARKDOWN_JS = Path(__file__).resolve().parents[2] / "static" / "js" / "markdown.js"

CASES = [
    (
        "**bold** and *italic* and _also_ and `co<de>`",
        "<p><strong>bold</strong> and <em>italic</em> and <em>also</em> and "
        "<code>co&lt;de&gt;</code></p>",
    ),
    ("one\ntwo\n\nthree", "<p>one<br>two</p><p>three</p>"),
    (
        "- a\n- **b**\n\n1. x\n2) y",
        "<ul><li>a</li><li><strong>b</strong></li></ul><ol><li>x</li><li>y</li></ol>",
    ),
    ("3. c\n4. d", '<ol start="3"><li>c</li><li>d</li></ol>'),
    (
        "```python\nif a < b:\n    print('**no**')\n```\nafter",
        '<pre><code data-lang="python">if a &lt; b:\n    print(&#39;**no**&#39;)</code></pre>'
        "<p>after</p>",
    ),
    ("```\nunclosed while streaming", "<pre><code>unclosed while streaming</code></pre>"),
    (
        "[docs](https://example.com/a_b?x=1&y=2)",
        '<p><a href="https://example.com/a_b?x=1&amp;y=2" rel="noopener noreferrer" '
        'target="_blank">docs</a></p>',
    ),
    (
        "see http://example.com.",
        '<p>see <a href="http://example.com" rel="noopener noreferrer" target="_blank">'
        "http://example.com</a>.</p>",
    ),
    ("[bad](javascript:alert(1))", "<p>[bad](javascript:alert(1))</p>"),
    ("<b>not bold</b>", "<p>&lt;b&gt;not bold&lt;/b&gt;</p>"),
    ("2*3*4 and snake_case_name", "<p>2*3*4 and snake_case_name</p>"),
]

HOSTILE = [
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    "<svg onload=alert(1)>",
    "<iframe src=javascript:alert(1)>",
    "[x](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    "[x](data:text/html,<script>alert(1)</script>)",
    '[x](http://a.example/" onmouseover="alert(1))',
    'http://a.example/"><img src=x onerror=alert(1)>',
    "`<img src=x onerror=alert(1)>`",
    "```\n</code></pre><img src=x onerror=alert(1)>\n```",
    "**<img src=x onerror=alert(1)>**",
    "- <script>alert(1)</script>\n1. <img src=x onerror=alert(1)>",
    "# <img src=x onerror=alert(1)>",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
    "\u0000<script>alert(1)</script>\u00001\u0000",
    "[<img src=x onerror=alert(1)>](https://a.example)",
]


@pytest.fixture(scope="module")
def renderer(chromium):
    context = chromium.new_context()
    page = context.new_page()
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.set_content("<div id=out></div>")
    page.add_script_tag(path=str(MARKDOWN_JS))
    yield page, dialogs
    context.close()


@pytest.mark.parametrize(("source", "html"), CASES)
def test_the_safe_subset(renderer, source, html):
    page, _ = renderer
    assert page.evaluate("s => window.TandemMarkdown.render(s)", source) == html


@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_text_stays_text(renderer, source):
    page, dialogs = renderer
    found = page.evaluate(
        """s => {
            const out = document.getElementById("out");
            out.innerHTML = window.TandemMarkdown.render(s);
            const all = [...out.querySelectorAll("*")];
            return {
                tags: [...new Set(all.map(e => e.tagName.toLowerCase()))],
                attributes: all.flatMap(e => [...e.attributes].map(a => a.name)),
                hrefs: [...out.querySelectorAll("a")].map(a => a.getAttribute("href")),
                rels: [...out.querySelectorAll("a")].map(a => a.rel),
            };
        }""",
        source,
    )
    allowed = {
        "p",
        "br",
        "strong",
        "em",
        "code",
        "pre",
        "ul",
        "ol",
        "li",
        "a",
        "hr",
        "h3",
        "h4",
        "h5",
        "h6",
    }
    assert set(found["tags"]) <= allowed, found
    assert set(found["attributes"]) <= {"href", "rel", "target", "data-lang", "start"}, found
    assert all(href.startswith(("http://", "https://")) for href in found["hrefs"]), found
    assert all(rel == "noopener noreferrer" for rel in found["rels"]), found
    assert dialogs == []
