"""Tandem's inference: the engine (`engine/`), model provisioning (`provisioning/`) and the HTTP
APIs (`api/`); api may import provisioning and engine, provisioning the engine, the engine
neither."""
