"""Tandem's project configuration; loads the Celery app so shared tasks bind to it."""

from config.celery import app as celery_app

__all__ = ("celery_app",)
