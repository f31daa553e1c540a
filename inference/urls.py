"""Routes of the generation API (TGI and OpenAI wire formats) and metrics."""

from django.urls import path

from inference import metrics_view, openai_views, openapi, tgi_views

urlpatterns = [
    path("generate", tgi_views.generate, name="tgi-generate"),
    path("generate_stream", tgi_views.generate_stream, name="tgi-generate-stream"),
    path("v1/chat/completions", openai_views.chat_completions, name="openai-chat"),
    path("v1/completions", openai_views.completions, name="openai-completions"),
    path("v1/models", openai_views.models, name="openai-models"),
    path("metrics", metrics_view.metrics, name="metrics"),
    path("openapi.json", openapi.openapi_json, name="openapi"),
]
