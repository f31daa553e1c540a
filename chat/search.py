"""Finding a user's conversations by their title and the words said in them.

On PostgreSQL this is full-text search (`django.contrib.postgres.search`: stemmed, so "cats"
finds "cat", and written as people type a web search: quotes, `or`, `-word`); elsewhere
(SQLite) a plain case-insensitive substring match. Both look at the title, the user's
messages and the replies' text.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.search import SearchQuery, SearchVector
from django.db import connection
from django.db.models import Q, QuerySet

from chat.models import Conversation, Message, Part


def conversation_search(user, query: str) -> QuerySet[Conversation]:
    """The user's conversations matching `query`, most recently active first."""
    owned = Conversation.objects.filter(owner=user)
    query = query.strip()
    if not query:
        return owned
    if connection.vendor == "postgresql":
        return owned.filter(full_text_match(query))
    return owned.filter(
        Q(title__icontains=query)
        | Q(pk__in=Message.objects.filter(text__icontains=query).values("conversation_id"))
        | Q(
            pk__in=Part.objects.filter(kind=Part.Kind.TEXT, text__icontains=query).values(
                "message__conversation_id"
            )
        )
    )


def full_text_match(query: str) -> Q:
    """Conversations whose title, user messages or reply texts match a web-style query."""
    config = settings.TANDEM_SEARCH_CONFIG
    wanted = SearchQuery(query, search_type="websearch", config=config)
    titles = Conversation.objects.annotate(found=SearchVector("title", config=config)).filter(
        found=wanted
    )
    messages = Message.objects.annotate(found=SearchVector("text", config=config)).filter(
        found=wanted
    )
    replies = Part.objects.annotate(found=SearchVector("text", config=config)).filter(
        kind=Part.Kind.TEXT, found=wanted
    )
    return (
        Q(pk__in=titles.values("pk"))
        | Q(pk__in=messages.values("conversation_id"))
        | Q(pk__in=replies.values("message__conversation_id"))
    )
