"""Routes of the generation API (TGI and OpenAI wire formats) and metrics."""

from django.urls import path

from inference.api import metrics_view, openai, openapi, tgi

urlpatterns = [
    path("generate", tgi.generate, name="tgi-generate"),
    path("generate_stream", tgi.generate_stream, name="tgi-generate-stream"),
    path("v1/chat/completions", openai.chat_completions, name="openai-chat"),
    path("v1/completions", openai.completions, name="openai-completions"),
    path("v1/models", openai.models, name="openai-models"),
    path("metrics", metrics_view.metrics, name="metrics"),
    path("openapi.json", openapi.openapi_json, name="openapi"),
]
