"""Tandem's inference: model provisioning and the in-process engine."""
