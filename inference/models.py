"""The inference app's models, which Django loads from here: the API keys and the requests
made with them live beside their lookup in `inference/api/keys.py`."""

from inference.api.keys import ApiKey, ApiRequest

__all__ = ["ApiKey", "ApiRequest"]
