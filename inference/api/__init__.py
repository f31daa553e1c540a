"""The HTTP generation APIs (TGI and OpenAI wire formats), their auth, errors, OpenAPI document
and /metrics. The running engine comes from the provisioning runtime."""
