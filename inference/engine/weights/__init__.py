"""Weight formats for the runner: dense (the model's own dtype) or the GGUF's Q4_1 as int4."""
