"""Saved conversations for the browser tests that need a finished reply but not the model."""

from __future__ import annotations

from chat.models import Conversation, Message, Part

RICH_REPLY = """Here is a comparison, and a function.

| language | typing | first release |
|---|:---:|--:|
| Python | dynamic | 1991 |
| Rust | static | 2015 |

```python
def greet(name: str) -> str:
    \"\"\"Say hello.\"\"\"
    return f"Hello, {name}!"
```

1. Install it
   - with `pip`
   - or from source
2. Run it
"""


def rich_conversation(owner, title: str = "Tables and code") -> tuple[Conversation, Message]:
    """A conversation whose one reply has a table, a highlighted code block and nested lists."""
    convo = Conversation.objects.create(owner=owner, title=title)
    Message.objects.create(
        conversation=convo,
        role="user",
        position=0,
        text="Compare Python and Rust, and show a greeting function.",
    )
    reply = Message.objects.create(conversation=convo, role="assistant", position=1)
    Part.objects.create(
        message=reply, index=0, kind="text", state="succeeded", text=RICH_REPLY, seq=40
    )
    return convo, reply


def add_partial_reply(convo: Conversation, position: int = 2) -> Message:
    """A reply whose text finished and whose image failed: the partial badge, the card."""
    Message.objects.create(
        conversation=convo, role="user", position=position, text="Draw a boat.", wants_image=True
    )
    reply = Message.objects.create(
        conversation=convo, role="assistant", position=position + 1, wants_image=True
    )
    Part.objects.create(
        message=reply, index=0, kind="text", state="succeeded", text="Here is **a boat**.", seq=5
    )
    Part.objects.create(
        message=reply, index=1, kind="image", state="failed", error="Failed after 4 tries"
    )
    return reply
