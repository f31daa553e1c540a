"""Errors of model provisioning that a person must be able to read and act on."""


class ModelUnavailable(Exception):
    """The configured model cannot be found or loaded; the message says what to do."""
