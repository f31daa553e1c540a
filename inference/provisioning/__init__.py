"""Model provisioning: where the weights come from, loading them, the process's runtime and
its metrics. May import the engine; never the HTTP APIs."""
